"""``rattn experiment lm``: the character-level LM learning-rate sweep (smoke preset)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from proofs_checks.cli import main  # noqa: E402
from torch_port.experiments import corpus as corpus_lib  # noqa: E402
from torch_port.experiments import lm, lm_arms, lm_report, runs  # noqa: E402
from torch_port.experiments.common import Checkpoint, RunOptions, configure  # noqa: E402
from torch_port.optim import RiemannianAdam, RiemannianMomentum  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(400))


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread, as the presets use (tiny ops on a shared 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _strip(runs: list[dict]) -> list[dict]:
    """Run records without their wall-clock times (the only field allowed to differ)."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in runs]


def _smoke(tmp_path: Path, **kw) -> dict:
    options = RunOptions(preset="smoke", out=tmp_path, progress=False, **kw)
    return lm.run(options)


def test_smoke_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["experiment", "lm", "--preset", "smoke", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "best final validation loss" in out and "mha" in out and "gqa" in out
    directory = tmp_path / "lm"
    doc = json.loads((directory / "results.json").read_text())
    assert set(doc) == {"experiment", "preset", "config", "runs", "summary", "environment"}
    assert doc["experiment"] == "lm" and doc["preset"] == "smoke"
    cfg = doc["config"]
    n_runs = len(cfg["configs"]) * len(cfg["arms"]) * len(cfg["lrs"]) * len(cfg["seeds"])
    assert len(doc["runs"]) == n_runs == 8
    for r in doc["runs"]:
        assert r["steps_done"] == cfg["steps"] and not r["diverged"]
        # training works: below the uniform byte distribution (ln 256 nats) and falling
        assert r["val_loss"] < math.log(256)
        assert r["history"][-1]["val_loss"] < r["history"][0]["val_loss"]
        assert [h["step"] for h in r["history"]] == [2, 4]
    table = {(r["config"], r["arm"]): r for r in doc["summary"]["table"]}
    assert set(table) == {(c, a) for c in ("mha", "gqa") for a in ("adamw", "stiefel")}
    for (name, arm), row in table.items():
        losses = {lr: v for lr, v in row["val_loss_by_lr"].items()}
        assert row["best_val_loss"] == min(losses.values())
        assert (
            repr(row["best_lr"]) in losses and losses[repr(row["best_lr"])] == row["best_val_loss"]
        )
        if arm == "stiefel":
            adamw = table[(name, "adamw")]["best_val_loss"]
            assert row["minus_adamw"] == pytest.approx(row["best_val_loss"] - adamw)
    assert doc["summary"]["corpus"]["source"] == "stdlib"
    assert doc["summary"]["corpus"]["bytes"] == cfg["corpus_bytes"]
    assert "QK and VO products" in doc["summary"]["protocol"]
    assert "RiemannianMomentum" in doc["summary"]["protocol"]
    # the paper's protocol: the stiefel arm's plain parameters at AdamW's best lr (per config)
    for name in ("mha", "gqa"):
        adamw = {
            r["lr"]: r["val_loss"]
            for r in doc["runs"]
            if (r["config"], r["arm"]) == (name, "adamw")
        }
        best = min(adamw, key=adamw.get)
        assert doc["summary"]["plain_lr_by_config"][name] == best
        for r in doc["runs"]:
            if r["config"] == name:
                assert r["plain_lr"] == (None if r["arm"] == "adamw" else best)
    md = (directory / "results.md").read_text()
    assert "| adamw | mha |" in md and "best lr" in md
    for png in ("lr_sweep.png", "curves.png"):
        data = (directory / png).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
    assert not list(directory.glob("checkpoint-*"))  # removed once the sweep is complete


def test_same_seed_same_metrics(tmp_path: Path) -> None:
    first = _smoke(tmp_path / "a")
    second = _smoke(tmp_path / "b")
    assert _strip(first["runs"]) == _strip(second["runs"])
    other = _smoke(tmp_path / "c", seeds=(1,))
    assert [r["val_loss"] for r in other["runs"]] != [r["val_loss"] for r in first["runs"]]


class _Bar:
    """Records the progress updates of a run."""

    def __init__(self) -> None:
        self.updates: list[int] = []

    def update(self, n: int) -> None:
        self.updates.append(n)


def _one_run_setup(tmp_path: Path) -> tuple[dict, corpus_lib.Corpus, lm.RunSpec]:
    config = configure(lm.PRESETS, RunOptions(preset="smoke", overrides={"steps": 6}))
    corpus = corpus_lib.load_corpus(None, config)
    return config, corpus, lm.RunSpec("gqa", "stiefel", 1e-2, 0)


def test_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    config, corpus, spec = _one_run_setup(tmp_path)
    cpu = torch.device("cpu")
    whole = lm.train_run(spec, config, corpus, cpu)
    ckpt = Checkpoint(tmp_path, lm.run_config(config, corpus), spec.key)
    assert lm.train_run(spec, config, corpus, cpu, ckpt, stop_after=3) is None
    assert ckpt.load()["step"] == 3
    bar = _Bar()
    resumed = lm.train_run(spec, config, corpus, cpu, ckpt, bar=bar)
    assert bar.updates == [3, 1, 1, 1]  # 3 steps restored from the checkpoint, 3 trained
    assert _strip([resumed]) == _strip([whole])
    assert ckpt.load()["step"] == 6  # left in place: runs.run_cached removes it


def test_sweep_resumes_from_its_checkpoints(tmp_path: Path) -> None:
    """A finished run's checkpoint is reused by the sweep (its record is taken as is). Under
    the shared protocol (plain_lr null): under the paper's, AdamW's record also sets the other
    arms' plain lr, which ``test_smoke_through_the_cli`` checks."""
    shared = {"plain_lr": None}
    config = configure(lm.PRESETS, RunOptions(preset="smoke", overrides=shared))
    corpus = corpus_lib.load_corpus(None, config)
    directory = tmp_path / "lm"
    directory.mkdir()
    spec = lm.RunSpec("mha", "adamw", float(config["lrs"][0]), 0)
    record = lm.train_run(spec, config, corpus, torch.device("cpu"))
    sentinel = dict(record, val_loss=1.25)
    base = lm.run_config(config, corpus)
    runs.run_cached(directory, base, spec.key, True, lambda checkpoint: sentinel)  # "finished"
    doc = _smoke(tmp_path, overrides=shared)
    mine = [r for r in doc["runs"] if (r["config"], r["arm"], r["lr"]) == ("mha", "adamw", spec.lr)]
    assert [r["val_loss"] for r in mine] == [1.25]
    assert not list(directory.glob("checkpoint-*"))
    fresh = _smoke(tmp_path / "fresh", resume=False, overrides=shared)
    assert _strip(fresh["runs"])[1:] == _strip(doc["runs"])[1:]


def test_geometries_and_gqa_refusal(tmp_path: Path) -> None:
    arms = ["fixed_rank_embedded", "block_fixed_rank_embedded", "stiefel", "stiefel_pair"]
    doc = _smoke(tmp_path, overrides={"arms": arms, "lrs": [1e-2], "plain_lr": None})
    ran = {(r["config"], r["arm"]) for r in doc["runs"]}
    assert ran == {("mha", a) for a in arms} | {("gqa", a) for a in arms if a != arms[0]} - {
        ("gqa", "stiefel_pair")
    }
    skipped = {(s["config"], s["arm"]): s["reason"] for s in doc["summary"]["skipped"]}
    assert set(skipped) == {("gqa", "fixed_rank_embedded"), ("gqa", "stiefel_pair")}
    assert all("one key/value head per query head" in m for m in skipped.values())
    # under MHA the block variant is the plain one, run for run
    assert doc["summary"]["block_equals_plain_mha"] == {"fixed_rank_embedded": 0.0}
    by = {(r["config"], r["arm"]): r["val_loss"] for r in doc["runs"]}
    assert by[("mha", "fixed_rank_embedded")] != by[("mha", "stiefel")]
    assert "Arms not run" in (tmp_path / "lm" / "results.md").read_text()


def test_corpus_file(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)
    doc = _smoke(tmp_path, corpus=path, overrides={"configs": ["mha"], "arms": ["adamw"]})
    info = doc["summary"]["corpus"]
    assert info["source"] == "file" and info["bytes"] == min(len(TEXT), 20_000)
    assert info["val_bytes"] == int(info["bytes"] * 0.1)


def test_stdlib_corpus_is_deterministic() -> None:
    a, info = corpus_lib.stdlib_corpus(50_000)
    b, _ = corpus_lib.stdlib_corpus(50_000)
    assert a == b and len(a) == 50_000
    assert info["first_file"] == "__future__.py"
    assert a.startswith(Path(info["root"], "__future__.py").read_bytes())


def test_summary_picks_lowest_mean_and_skips_diverged() -> None:
    def rec(arm: str, lr: float, seed: int, v: float) -> dict:
        return {"config": "mha", "arm": arm, "lr": lr, "seed": seed, "val_loss": v}

    runs = [
        rec("adamw", 1e-3, 0, 2.0),
        rec("adamw", 1e-3, 1, 2.2),  # mean 2.1
        rec("adamw", 1e-2, 0, 1.9),
        rec("adamw", 1e-2, 1, 2.5),  # mean 2.2: the best single seed is not the best mean
        rec("stiefel", 1e-3, 0, 2.3),
        rec("stiefel", 1e-3, 1, 2.3),
        rec("stiefel", 1e-2, 0, 1.0),
        rec("stiefel", 1e-2, 1, math.nan),  # one diverged seed disqualifies the lr
    ]
    adamw, stiefel = lm_report.summarise(runs, ["mha"], ["adamw", "stiefel"])
    assert adamw["best_lr"] == 1e-3 and adamw["best_val_loss"] == pytest.approx(2.1)
    assert adamw["seed_std"] == pytest.approx(math.sqrt(0.02))
    assert (adamw["seed_min"], adamw["seed_max"]) == (2.0, 2.2)
    assert adamw["best_lr_at_sweep_edge"]
    assert stiefel["best_lr"] == 1e-3 and stiefel["diverged_lrs"] == [1e-2]
    assert stiefel["minus_adamw"] == pytest.approx(0.2)
    # the order of the arms does not matter: AdamW's best is known before any row is filled
    stiefel2, adamw2 = lm_report.summarise(runs, ["mha"], ["stiefel", "adamw"])
    assert (stiefel2["arm"], adamw2["arm"]) == ("stiefel", "adamw")
    assert stiefel2["minus_adamw"] == pytest.approx(0.2) and "minus_adamw" not in adamw2
    # without AdamW in the sweep there is nothing to subtract
    (alone,) = lm_report.summarise(runs, ["mha"], ["stiefel"])
    assert "minus_adamw" not in alone


def _fake_step(exc: Exception):
    def step(self, closure=None):
        raise exc

    return step


def test_a_divergence_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimizer's divergence errors (non-finite gradient or point, rank collapse) mark the
    run diverged; it is never selected."""
    config, corpus, spec = _one_run_setup(tmp_path)
    for message in (
        "non-finite gradient for blocks.0.attn.w_q: 3 non-finite entries (NaN or inf) of 64",
        "the stiefel point of w_q: the point after this step has 2 non-finite entries",
        "the fixed_rank_embedded point of w_q: the step leaves the rank-4 manifold: σ_r/σ_1 = 0",
        "polar factor of a rank-deficient matrix: the matrix is zero",
    ):
        monkeypatch.setattr(lm.RiemannianMomentum, "step", _fake_step(ValueError(message)))
        record = lm.train_run(spec, config, corpus, torch.device("cpu"))
        assert record["diverged"] and message in record["error"]
        assert record["steps_done"] == 0 and math.isnan(record["val_loss"])


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("a bug in a kernel"),
        ValueError("point is off St(16, 8): ‖WᵀW − I‖ = 1e-2"),
        TypeError("bad argument"),
    ],
)
def test_a_bug_in_a_step_propagates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    """Any other error of an optimizer step is not a divergence: it propagates."""
    config, corpus, spec = _one_run_setup(tmp_path)
    monkeypatch.setattr(lm.RiemannianMomentum, "step", _fake_step(exc))
    with pytest.raises(type(exc), match=str(exc)[:12]):
        lm.train_run(spec, config, corpus, torch.device("cpu"))


def test_unexpected_warnings_of_a_step_are_not_silenced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import warnings

    config, corpus, spec = _one_run_setup(tmp_path)
    real = lm.RiemannianMomentum.step

    def step(self, closure=None):
        warnings.warn("something unexpected", RuntimeWarning, stacklevel=1)
        return real(self, closure)

    monkeypatch.setattr(lm.RiemannianMomentum, "step", step)
    with pytest.warns(RuntimeWarning, match="something unexpected"):
        lm.train_run(spec, config, corpus, torch.device("cpu"))


def test_val_windows_stay_inside_a_long_split() -> None:
    """Window starts are computed in integers: a float32 linspace rounds past the last start
    above 2²⁴ bytes."""
    val = torch.arange(17_000_000, dtype=torch.int32)
    windows = corpus_lib.val_windows(val, 16, 3)
    last = len(val) - 17
    assert windows[:, 0].tolist() == [0, round(last / 2), last]
    assert windows[-1, -1].item() == len(val) - 1
    assert corpus_lib.val_windows(torch.arange(20), 16, 8)[:, 0].tolist() == [0, 1, 2, 3]
    assert corpus_lib.val_windows(torch.arange(17), 16, 8)[:, 0].tolist() == [0]


def test_threads_are_fixed_and_recorded(tmp_path: Path) -> None:
    """Every preset fixes its thread count; results.json records the count the runs used."""
    assert all(isinstance(p["threads"], int) and p["threads"] >= 1 for p in lm.PRESETS.values())
    torch.set_num_threads(2)
    doc = _smoke(tmp_path, overrides={"configs": ["mha"], "arms": ["adamw"], "lrs": [1e-2]})
    assert torch.get_num_threads() == 2  # restored
    assert doc["environment"]["torch_threads"] == doc["summary"]["environment_threads"] == 1


def test_weight_decay_setup_is_stated(tmp_path: Path) -> None:
    assert "left off" in lm.__doc__ and "RA-5" in lm.__doc__
    doc = _smoke(tmp_path, overrides={"configs": ["mha"], "arms": ["adamw"], "lrs": [1e-2]})
    assert "not decayed" in doc["summary"]["point_weight_decay"]
    md = (tmp_path / "lm" / "results.md").read_text()
    assert "the attention projections included in the adamw arm" in md and "RA-5" in md


def test_adamw_sweeps_its_own_grid(tmp_path: Path) -> None:
    """With ``adamw_lrs`` AdamW runs over its grid and the geometry over ``lrs``, and the
    geometry's plain parameters take AdamW's best lr from AdamW's grid."""
    doc = _smoke(
        tmp_path,
        overrides={"configs": ["mha"], "adamw_lrs": [1e-3, 2e-3], "lrs": [1e-2]},
    )
    lrs = {
        arm: sorted({r["lr"] for r in doc["runs"] if r["arm"] == arm})
        for arm in ("adamw", "stiefel")
    }
    assert lrs == {"adamw": [1e-3, 2e-3], "stiefel": [1e-2]}
    assert doc["summary"]["plain_lr_by_config"]["mha"] in (1e-3, 2e-3)
    assert {r["plain_lr"] for r in doc["runs"] if r["arm"] == "stiefel"} == {
        doc["summary"]["plain_lr_by_config"]["mha"]
    }
    assert (
        "AdamW over {0.001, 0.002}, the points over {0.01}"
        in (tmp_path / "lm" / "results.md").read_text()
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--corpus", "{tmp}/missing.txt"], "does not exist"),
        (["--corpus", "{tmp}"], "not a regular file"),
        (["--corpus", "{tmp}/short.txt"], "corpus too short: 30 bytes"),
    ],
)
def test_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    (tmp_path / "short.txt").write_text("x" * 30)
    argv = ["experiment", "lm", "--preset", "smoke", "--out", str(tmp_path / "out")]
    assert main(argv + [a.format(tmp=tmp_path) for a in args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lrs": [0.0]}, "lrs must be"),
        ({"adamw_lrs": []}, "adamw_lrs must be a non-empty list"),
        ({"adamw_lrs": [1e-3, float("inf")]}, "adamw_lrs must be"),
        ({"adamw_lrs": "0.001"}, "adamw_lrs must be"),
        ({"arms": ["sgd"]}, "unknown arms"),
        ({"configs": ["mqa"]}, "configs must be"),
        ({"steps": 0}, "steps must be a positive integer, got 0"),
        ({"val_fraction": 1.5}, "val_fraction must lie in"),
        ({"n_heads": 3}, "d_model = 16 must be divisible by n_heads = 3"),
        ({"n_heads": 4, "gqa_kv_heads": 3}, "gqa_kv_heads = 3 must divide n_heads = 4"),
        ({"d_mlp": 0}, "d_mlp must be a positive integer, got 0"),
        ({"threads": None}, "threads must be a positive integer, got None"),
        ({"products": "kv"}, "products must be one of"),
        ({"rule": "sgd"}, "rule must be one of"),
        ({"plain_lr": 0.1}, "plain_lr must be null"),
        ({"arms": ["stiefel"]}, "the arms must include adamw"),
        ({"momentum_c": 0.0}, "momentum_c"),
        ({"momentum_beta": 1.0}, "momentum_beta"),
    ],
)
def test_bad_configuration(tmp_path: Path, overrides: dict, message: str) -> None:
    """A bad setting is an error before any work, never a sweep of skipped arms."""
    with pytest.raises(ValueError, match=message):
        _smoke(tmp_path, overrides=overrides)
    assert not list(tmp_path.rglob("results.json"))


def test_only_the_known_refusal_skips_an_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model that fails to build for another reason is an error, not a skipped arm."""
    config = configure(lm.PRESETS, RunOptions(preset="smoke"))
    assert "one key/value head" in lm.arm_refusal(config, "gqa", "stiefel_pair")
    assert lm.arm_refusal(config, "mha", "stiefel_pair") is None
    assert lm.arm_refusal(config, "gqa", "block_stiefel_pair") is None

    def broken(*args, **kwargs):
        raise ValueError("some other problem")

    monkeypatch.setattr(lm_arms, "Transformer", broken)
    for name, arm in (
        ("mha", "stiefel"),
        ("gqa", "adamw"),
        ("mha", "fixed_rank_embedded"),
        ("gqa", "fixed_rank_embedded"),  # the known case, but another message
    ):
        with pytest.raises(ValueError, match="some other problem"):
            lm.arm_refusal(config, name, arm)
    with pytest.raises(ValueError, match="some other problem"):
        _smoke(tmp_path)
    assert not list(tmp_path.rglob("results.json"))


@pytest.mark.parametrize(
    ("products", "rule"), [("qkvo", "momentum"), ("qk", "adam"), ("vo", "adam")]
)
def test_optimizer_of_the_protocol(products: str, rule: str) -> None:
    """The paper's protocol puts W_V, W_O on the geometry too and trains the points with the
    momentum rule at the swept lr, the plain parameters at ``plain_lr``; the shared protocol
    keeps W_V, W_O plain (AdamW) and every group at the swept lr; ``products="vo"`` puts W_V,
    W_O on it and keeps W_Q, W_K plain."""
    overrides = {"products": products, "rule": rule}
    config = configure(lm.PRESETS, RunOptions(preset="smoke", overrides=overrides))
    spec = lm.RunSpec("mha", "stiefel", 3e-3, 0, 1e-2 if rule == "momentum" else None)
    model = lm.build_model(config, "mha", "stiefel", 0)
    opt = lm.make_optimizer(model, config, spec)
    assert type(opt) is (RiemannianMomentum if rule == "momentum" else RiemannianAdam)
    points = [g for g in opt.param_groups if g.get("geometry") is not None]
    plain = [g for g in opt.param_groups if g.get("geometry") is None]
    point_names = {n for g in points for n in g["param_names"]}
    vo = {n for n, _ in model.named_parameters() if n.endswith(("w_v", "w_o"))}
    qk = {n for n, _ in model.named_parameters() if n.endswith(("w_q", "w_k"))}
    assert vo and (vo <= point_names) == (products in ("vo", "qkvo"))
    assert qk and (qk <= point_names) == (products in ("qk", "qkvo"))
    plain_names = {n for g in plain for n in g["param_names"]}
    assert (vo | qk) <= point_names | plain_names and not point_names & plain_names
    assert all(g["lr"] == 3e-3 for g in points)
    assert all(g["lr"] == (spec.plain_lr or 3e-3) for g in plain)
    if rule == "momentum":
        assert all(g["beta"] == 0.9 and g["c"] == 1e-3 for g in points)
