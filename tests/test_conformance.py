"""rattn conform: the library's presets pass what they claim, every member of the zoo is flagged
by the property that names its fault (the suite's negative controls), and the command keeps its
contract (JSON fields, exit status 0/1/2, the certificate files)."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("torch")

from proofs_checks.cli import main
from proofs_checks.conformance import PROPERTIES, conform, parse_claims
from proofs_checks.conformance.report import FILES

TARGETS = "proofs_checks.conformance.targets"
ZOO = "proofs_checks.conformance.zoo"
FUSED = {"weight_decay": 0.1, "decay": "fused"}


def _conform(target: str, rule: str | None, settings: dict | None = None, **kw) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FrameDecayWarning of the decay checks
        return conform(target, rule=rule, settings=settings or {}, **kw)


@pytest.mark.parametrize(
    ("factory", "rule", "settings"),
    [
        ("riemannian_adam", "riemannian_adam", {}),
        ("riemannian_adam_eps0", "riemannian_adam", {"eps": 0.0}),
        ("riemannian_momentum", "riemannian_momentum", {}),
        ("rsgd", "rsgd", {}),
        ("normalized_rsgd", "normalized_rsgd", {}),
    ],
)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_presets_pass_every_property_they_claim(factory, rule, settings, dtype) -> None:
    report = _conform(f"{TARGETS}:{factory}", rule, settings, dtype=dtype)
    assert report["passed"], report["failed"]
    claimed = {row["id"] for row in report["properties"] if row["claimed"]}
    # every rule claims these; the order and (where defined) the degree come with the preset
    assert claimed >= {
        "CONF-MANIFOLD",
        "CONF-TANGENT",
        "CONF-DIRECTION",
        "CONF-ORDER",
        "CONF-EQUIVARIANCE",
        "CONF-DECAY",
        "CONF-STATE",
        "CONF-RULE",
    }
    assert report["first_departure_step"] is None


#: (zoo member, the rule it claims, settings, the property that names its fault)
ZOO_TABLE = [
    ("raw_gradient_rsgd", "rsgd", {}, "CONF-ORDER"),
    ("raw_gradient_adam", "riemannian_adam", {}, "CONF-DIRECTION"),
    ("bias_correction_off_by_one", "riemannian_adam", {}, "CONF-RULE"),
    ("halved_gradient", "rsgd", {}, "CONF-DIRECTION"),
    ("skipped_transport", "riemannian_momentum", {}, "CONF-RULE"),
    ("drifting_retraction", "rsgd", {}, "CONF-MANIFOLD"),
    ("elementwise_moment", "riemannian_adam", {}, "CONF-EQUIVARIANCE"),
    ("decay_on_frames", "riemannian_adam", {}, "CONF-DECAY"),
    ("decay_does_nothing", "riemannian_adam", FUSED, "CONF-DECAY"),
]


@pytest.mark.parametrize(("member", "rule", "settings", "flag"), ZOO_TABLE)
def test_every_zoo_member_is_flagged_by_the_property_naming_its_fault(
    member, rule, settings, flag
) -> None:
    report = _conform(f"{ZOO}:{member}", rule, settings)
    assert not report["passed"]
    assert flag in report["failed"], report["failed"]


@pytest.mark.parametrize(
    ("member", "rule", "settings"),
    [
        ("clean_adam", "riemannian_adam", {}),
        ("clean_adam_fused_decay", "riemannian_adam", FUSED),
        ("clean_rsgd", "rsgd", {}),
        ("clean_momentum", "riemannian_momentum", {}),
    ],
)
def test_the_zoo_clean_members_pass(member, rule, settings) -> None:
    """The positive controls of the table above: the same rule without its fault passes."""
    report = _conform(f"{ZOO}:{member}", rule, settings)
    assert report["passed"], report["failed"]


def test_a_departure_is_dated() -> None:
    """A skipped transport shows only once a moment has been carried: at step 2."""
    report = _conform(f"{ZOO}:skipped_transport", "riemannian_momentum")
    assert report["first_departure_step"] == 2


def test_an_unclaimed_property_is_measured_not_failed() -> None:
    report = _conform(f"{ZOO}:elementwise_moment", None, claims=parse_claims("manifold"))
    rows = {row["id"]: row for row in report["properties"]}
    assert report["passed"]
    assert rows["CONF-EQUIVARIANCE"]["claimed"] is False
    assert rows["CONF-EQUIVARIANCE"]["passed"] is False  # measured: it is not equivariant
    assert rows["CONF-RULE"]["passed"] is None  # no rule: not measured


def test_a_wrong_order_claim_fails_and_the_true_one_passes() -> None:
    """QR (first order for r ≥ 2) against order 2 and order 1."""

    def qr_rsgd(params):
        import torch_port as tp

        return tp.RSGD([{"params": params, "geometry": "stiefel", "retraction": "qr"}], lr=1e-2)

    second = _conform(qr_rsgd, None, claims={"order": 2})
    first = _conform(qr_rsgd, None, claims={"order": 1})
    assert second["failed"] == ["CONF-ORDER"] and first["passed"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("manifold,bogus", "unknown claim 'bogus'"),
        ("order=3", "claim order=3: order= one of"),
        ("order", "claim 'order'"),  # a bare valued claim is not order=1
        ("decay=shrink", "claim decay='shrink'"),
        ("metric=flat", "claim metric='flat'"),
        ("state=false", "state takes no value"),
        (",", "claims no property"),
        ("metric=canonical", "claims no property"),
    ],
)
def test_bad_claims_are_refused(text, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_claims(text)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no_such_module:f"], "cannot import 'no_such_module'"),
        ([f"{TARGETS}:missing"], "has no callable 'missing'"),
        ([f"{TARGETS}"], "TARGET must be MODULE:FACTORY"),
        (["json:dumps"], "the factory raised TypeError"),
        ([f"{TARGETS}:rsgd", "--rule", "adam"], "unknown rule 'adam'"),
        ([f"{TARGETS}:rsgd", "--rule", "rsgd", "--set", "beta=1"], "has no setting beta"),
        ([f"{TARGETS}:rsgd", "--dtype", "float16"], "--dtype 'float16'"),
        ([f"{TARGETS}:rsgd", "--geometry", "grassmann"], "--geometry"),
        ([f"{TARGETS}:rsgd", "--set", "lr=null"], "lr must be a finite number > 0"),
        ([f"{TARGETS}:rsgd", "--rule", "riemannian_adam", "--set", "betas=0.9"], "not iterable"),
        (["sys:exit"], "the factory raised SystemExit"),
    ],
)
def test_bad_usage_exits_2_naming_the_problem(argv, message, capsys) -> None:
    assert main(["conform", *argv, "--json"]) == 2
    assert message in capsys.readouterr().err


def test_the_json_contract_and_the_certificate(tmp_path, capsys) -> None:
    code = main(
        ["conform", f"{ZOO}:halved_gradient", "--rule", "rsgd", "--json", "--out", str(tmp_path)]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["passed"] is False
    assert doc["first_departure_step"] == 1
    assert [row["id"] for row in doc["properties"]] == list(PROPERTIES)
    for row in doc["properties"]:
        assert {"id", "passed", "claimed", "detail"} <= set(row)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
    written = json.loads((tmp_path / "conformance.json").read_text(encoding="utf-8"))
    assert written["source_hash"] == doc["source_hash"] and len(doc["source_hash"]) == 64
    assert "CONF-DIRECTION" in (tmp_path / "conformance.md").read_text(encoding="utf-8")
    assert (tmp_path / "conformance.tex").read_text(encoding="ascii")  # ASCII LaTeX
    assert main(["conform", f"{TARGETS}:rsgd", "--rule", "rsgd", "--json"]) == 0


#: geoopt's optimizers against their field rules (reference.field_rules), per Stiefel
GEOOPT = [
    ("geoopt_adam", "geoopt_riemannian_adam", {}),
    ("geoopt_adam_euclidean", "geoopt_riemannian_adam", {"stiefel": "euclidean"}),
    ("geoopt_sgd", "geoopt_riemannian_sgd", {"momentum": 0.9}),
    ("geoopt_sgd_euclidean", "geoopt_riemannian_sgd", {"momentum": 0.9, "stiefel": "euclidean"}),
]


@pytest.mark.parametrize(("factory", "rule", "settings"), GEOOPT)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_geoopt_follows_its_field_rule(factory, rule, settings, dtype) -> None:
    """The field rules state geoopt's arithmetic: its runs agree with them step by step (and
    take a tangent, descending, O(d)-equivariant first step)."""
    pytest.importorskip("geoopt")
    report = _conform(f"{TARGETS}:{factory}", rule, settings, dtype=dtype)
    rows = {row["id"]: row for row in report["properties"]}
    for pid in ("CONF-RULE", "CONF-DIRECTION", "CONF-TANGENT", "CONF-EQUIVARIANCE"):
        assert rows[pid]["passed"] is True, (pid, rows[pid]["detail"])


def test_geoopt_findings() -> None:
    """What the suite measures of geoopt 0.5.1 (docs/conformance.md): the canonical Cayley map
    is not steepest descent in the canonical metric at first order (its differential at 0 is
    u ↦ u + XXᵀu), and a RiemannianAdam resumed from its state_dict departs (torch's
    load_state_dict turns the int "step" into a float32 tensor, so the bias corrections are
    computed in float32)."""
    geoopt = pytest.importorskip("geoopt")
    if geoopt.__version__ != "0.5.1":
        pytest.skip(f"measured on geoopt 0.5.1, installed {geoopt.__version__}")
    steepest = _conform(
        f"{TARGETS}:geoopt_adam", None, claims=parse_claims("direction,metric=canonical")
    )
    assert steepest["failed"] == ["CONF-DIRECTION"]
    resumed = _conform(f"{TARGETS}:geoopt_adam", "geoopt_riemannian_adam")
    assert resumed["failed"] == ["CONF-STATE"]
    assert "resumed from state_dict departs" in resumed["properties"][7]["detail"]


def _wrapped(make_step):
    """A factory: the zoo's clean Adam with its step wrapped by ``make_step(opt, step)``."""
    from proofs_checks.conformance import zoo

    def factory(params):
        opt = zoo.clean_adam(params)
        opt.step = make_step(opt, opt.step)
        return opt

    return factory


def _nan_after(k):
    def make(opt, step):
        def wrapped(closure=None):
            step()
            if opt.state[opt.param_groups[0]["params"][0]]["step"] > k:
                for p in opt.param_groups[0]["params"]:
                    p.data.fill_(float("nan"))

        return wrapped

    return make


def _late_half_step(opt, step):
    def wrapped(closure=None):
        late = opt.state.get(opt.param_groups[0]["params"][0], {}).get("step", 0) >= 60
        lrs = [g["lr"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["lr"] *= 0.5 if late else 1.0
        step()
        for g, lr in zip(opt.param_groups, lrs, strict=True):
            g["lr"] = lr

    return wrapped


def _frozen_lr(opt, step):
    first = {}

    def wrapped(closure=None):
        lrs = [g["lr"] for g in opt.param_groups]
        for i, g in enumerate(opt.param_groups):
            first.setdefault(i, g["lr"])
            g["lr"] = g["lr"] and first[i]  # honours lr 0 only: ignores a scheduler
        step()
        for g, lr in zip(opt.param_groups, lrs, strict=True):
            g["lr"] = lr

    return wrapped


@pytest.mark.parametrize(
    ("make_step", "flag", "departs"),
    [
        # NaN is not a small residual; the first parameter's count lags one step behind the
        # run's (its grad is None at one step), so its 61st step is the run's 62nd
        (_nan_after(60), "CONF-MANIFOLD", 62),
        (_late_half_step, "CONF-RULE", 62),  # right for 60 steps of its own count only
        (_frozen_lr, "CONF-RULE", 2),  # ignores a schedule
    ],
)
def test_late_and_scheduled_faults_are_found(make_step, flag, departs) -> None:
    report = _conform(_wrapped(make_step), "riemannian_adam")
    assert flag in report["failed"] and report["first_departure_step"] == departs


def test_a_state_dict_that_changes_the_run_is_found() -> None:
    """Saving a checkpoint must not change training: here state_dict() halves the live moment."""

    def make(params):
        from proofs_checks.conformance import zoo

        opt = zoo.clean_adam(params)
        save = opt.state_dict

        def state_dict():
            for st in opt.state.values():
                st["exp_avg"] = st["exp_avg"] * 0.5
            return save()

        opt.state_dict = state_dict
        return opt

    report = _conform(make, "riemannian_adam")
    assert report["failed"] == ["CONF-STATE"]
    assert "a run saved departs" in report["properties"][7]["detail"]


def test_what_the_factory_prints_does_not_break_the_json(capsys) -> None:
    assert (
        main(["conform", "proofs_checks.conformance.targets:rsgd", "--rule", "rsgd", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["passed"]


def test_out_refuses_a_directory_in_place_of_a_file(tmp_path, capsys) -> None:
    (tmp_path / "conformance.json").mkdir()
    argv = ["conform", f"{TARGETS}:rsgd", "--rule", "rsgd", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "is a directory" in capsys.readouterr().err
