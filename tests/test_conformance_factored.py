"""rattn conform on the ten design points (``--geometry NAME``): the problem's gradients are the
chain rule's, the spaces' normal parts are those of the sets, the port's presets pass what they
claim on every geometry, and each wrong optimizer of ``factored_zoo`` is flagged by the property
that names its fault."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

import reference as ref
from proofs_checks.cli import main
from proofs_checks.conformance import conform
from proofs_checks.conformance.factored_zoo import FACTORED, rerepresented
from proofs_checks.conformance.problem import Problem
from proofs_checks.conformance.spaces import FactorSpace

TEN = [name for name in ref.GEOMETRIES if name != "stiefel"]
TARGETS = "proofs_checks.conformance.targets"
U64 = 2.0**-53


def _loss(problem: Problem, arrays: list, t: int) -> float:
    """F(W) = Σ tr((W − T)ᵀA(W − T)N) + ⟨B_t, W⟩ over the elements and block groups, the loss
    whose gradient the oracle states as 2A(W − T)N + B_t (A symmetric, N diagonal)."""
    total = 0.0
    sp = problem.space
    for i in range(len(sp)):
        rng = np.random.default_rng([problem.seed, 4, t, i])
        xs = problem.elements(arrays, i)
        mats = [sp.matrices(i, x) for x in xs]
        rows, cols = mats[0][0].shape
        b = rng.standard_normal((len(xs), len(mats[0]), rows, cols))
        n = np.diag(np.arange(cols, 0, -1.0))
        for ws, bs in zip(mats, b, strict=True):
            for w, tt, bb in zip(ws, problem.target[i], bs, strict=True):
                e = w - tt
                total += float(np.trace(e.T @ problem.a[i] @ e @ n) + np.sum(bb * w))
    return total


@pytest.mark.parametrize("name", TEN)
def test_the_oracle_is_the_gradient_of_its_loss(name) -> None:
    """A central difference of F along a random direction of the parameters equals ⟨G, Z⟩:
    truncation O(h²·‖F'''‖) and rounding u·|F|/h give, at h = 1e-5, an error below 1e-6
    relative to |⟨G, Z⟩| + |F|·1e-6 for these problems (F of order 10², ‖G‖ of order 10)."""
    problem = Problem.make(0, name)
    x = problem.start()
    g = problem.gradients(x, 3)
    rng = np.random.default_rng(7)
    z = [rng.standard_normal(a.shape) for a in x]
    h = 1e-5
    plus = _loss(problem, [a + h * d for a, d in zip(x, z, strict=True)], 3)
    minus = _loss(problem, [a - h * d for a, d in zip(x, z, strict=True)], 3)
    slope = (plus - minus) / (2 * h)
    exact = sum(float(np.sum(gi * zi)) for gi, zi in zip(g, z, strict=True))
    assert abs(slope - exact) <= 1e-6 * (abs(exact) + abs(plus) * 1e-6 / h)
    # the negative control: the gradient without the factor 2 of the quadratic term
    half = Problem(problem.seed, problem.space, tuple(0.5 * a for a in problem.a), problem.target)
    wrong = sum(float(np.sum(gi * zi)) for gi, zi in zip(half.gradients(x, 3), z, strict=True))
    assert abs(slope - wrong) > 1e3 * 1e-6 * (abs(exact) + abs(plus) * 1e-6 / h)


@pytest.mark.parametrize("name", TEN)
def test_the_rotated_problem_is_the_problem_seen_through_q(name) -> None:
    """G'(QW) = Q·G(W): the rotated start's view is Q times the start's, and the factor
    gradients there are the rotated factor gradients (to float64 rounding of products of length
    ≤ 12: 1e-12 of their size)."""
    problem = Problem.make(0, name)
    turned = problem.rotated()
    sp = problem.space
    x, y = problem.start(), turned.start()
    for i, q in enumerate(turned.rotation):
        for a, b in zip(problem.elements(x, i), turned.elements(y, i), strict=True):
            for va, vb in zip(sp.view(i, sp.rotate(q, a)), sp.view(i, b), strict=True):
                assert np.linalg.norm(va - vb) <= 1e-12 * np.linalg.norm(va)
    # the factor gradients transform as the factors: Q on the row factor, the rest unchanged
    ga, gb = problem.gradients(x, 2), turned.gradients(y, 2)
    for i, q in enumerate(turned.rotation):
        for a, b in zip(problem.elements(ga, i), turned.elements(gb, i), strict=True):
            flat_a = [f for s in sp._sets(sp.rotate(q, a)) for f in s]
            flat_b = [f for s in sp._sets(b) for f in s]
            for fa, fb in zip(flat_a, flat_b, strict=True):
                assert np.linalg.norm(fa - fb) <= 1e-12 * np.linalg.norm(fb)


@pytest.mark.parametrize("name", TEN)
def test_normal_parts_are_those_of_the_set(name) -> None:
    """A tangent vector of the reference geometry, seen in the view, has no normal part (to
    1e-13 of it: products of length ≤ 12 and one SVD); the normal part is idempotent. Control:
    a Stiefel-style normal part (W·sym(WᵀD) per matrix, the wrong set) does not vanish on the
    same tangent vectors."""
    sp = FactorSpace(name)
    rng = np.random.default_rng(11)
    geometry = sp.geometry(0)
    x = geometry.random_point(rng)
    xi = sp.view_tangent(0, x, geometry.random_tangent(x, rng))
    normal = sp.normal(0, x, xi)
    size = np.sqrt(sum(np.sum(v * v) for v in xi))
    assert np.sqrt(sum(np.sum(n * n) for n in normal)) <= 1e-13 * size
    z = [rng.standard_normal(v.shape) for v in xi]
    nz = sp.normal(0, x, z)
    again = sp.normal(0, x, nz)
    assert all(
        np.linalg.norm(a - b) <= 1e-13 * np.linalg.norm(a) for a, b in zip(nz, again, strict=True)
    )
    if not sp.pairs:  # the wrong set's normal part sees these tangent vectors as normal
        wrong = [w @ ((w.T @ d + d.T @ w) / 2) for w, d in zip(sp.view(0, x), xi, strict=True)]
        assert np.sqrt(sum(np.sum(n * n) for n in wrong)) > 1e-3 * size


#: The port's presets on the ten (float64): all they claim (the cheaper geometries in float32 too).
#: By default the two float32 rows and the first two of the ten; the rest with ``-m slow``.
PRESETS = [
    pytest.param(name, "float64", marks=() if i < 2 else pytest.mark.slow)
    for i, name in enumerate(TEN)
] + [
    ("stiefel_pair", "float32"),
    ("fixed_rank_quotient", "float32"),
]


@pytest.mark.parametrize(("name", "dtype"), PRESETS)
def test_the_port_passes_every_property_it_claims_on_the_ten(name, dtype) -> None:
    report = conform(
        f"{TARGETS}:riemannian_adam", geometry=name, rule="riemannian_adam", dtype=dtype
    )
    assert report["passed"], report["failed"]
    rows = {row["id"]: row for row in report["properties"]}
    claimed = {k for k, row in rows.items() if row["claimed"]}
    assert claimed >= {
        "CONF-MANIFOLD",
        "CONF-TANGENT",
        "CONF-DIRECTION",
        "CONF-EQUIVARIANCE",
        "CONF-DECAY",
        "CONF-STATE",
        "CONF-RULE",
    }
    # the order is claimed where the geometry is embedded, and not read from W on a quotient
    assert ("CONF-ORDER" in claimed) == (not name.endswith("_quotient"))
    # coupled decay acts on R1 and R2, none on the frame geometries (RA-5)
    expected = "coupled" if "fixed_rank" in name else "none"
    assert rows["CONF-DECAY"]["claim"] == expected


@pytest.mark.parametrize("member", list(FACTORED))
def test_every_wrong_optimizer_on_the_ten_is_flagged_by_its_property(member) -> None:
    m = FACTORED[member]
    report = conform(m.factory, geometry=m.geometry, rule=m.rule, claims=m.claims or None)
    assert not report["passed"]
    assert m.flagged_by in report["failed"], report["failed"]


@pytest.mark.parametrize("name", ["fixed_rank_quotient", "partial_isometry_quotient"])
def test_another_representative_with_its_moment_moved_is_the_same_optimizer(name) -> None:
    """On a quotient an optimizer may keep any representative of its point: (A M, B M^{-ᵀ}) or
    (U Q, V Q) after every step, the moment moved the same way, is the port's optimizer and
    passes; projecting the moment at the new factors instead is flagged (``FACTORED``)."""
    report = conform(rerepresented, geometry=name, rule="riemannian_adam")
    assert report["passed"], report["failed"]


@pytest.mark.parametrize("name", ["fixed_rank_embedded", "fixed_rank_quotient", "stiefel_pair"])
def test_a_rule_with_weight_decay_passes_on_the_ten(name) -> None:
    """--set weight_decay: the first-order properties compare the optimizer and the rule both
    without decay, and where coupled decay acts (R1, R2) no degree is claimed (λ·x does not
    scale with G)."""
    settings = {"weight_decay": 0.1, "eps": 0.0}
    report = conform(
        f"{TARGETS}:riemannian_adam_eps0", geometry=name, rule="riemannian_adam", settings=settings
    )
    assert report["passed"], report["failed"]
    assert ("degree" in report["claims"]) == (name == "stiefel_pair")


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        ({}, "claims no property"),
        ({"rules": True}, "unknown claim 'rules'"),
        ({"order": 3}, "order= one of"),
        ({"state": False}, "claimed by True or left out"),
    ],
)
def test_claims_given_to_the_api_are_checked_as_the_command_checks_them(claims, message) -> None:
    with pytest.raises(ValueError, match=message):
        conform(f"{TARGETS}:rsgd", geometry="stiefel_pair", rule="rsgd", claims=claims)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--geometry", "fixed_rank_quotient", "--set", 'retraction="qr"'], "retraction"),
        (["--rule", "geoopt_riemannian_adam"], "use --geometry stiefel"),
        (["--claims", "manifold,metric=embedded"], "the metric is the geometry's own"),
        (["--rule", "riemannian_adam", "--set", 'decay="fused"'], "fused decay is stated"),
        (["--set", 'retraction="bogus"'], "bogus"),
    ],
)
def test_bad_usage_on_the_ten_exits_2(argv, message, capsys) -> None:
    target = f"{TARGETS}:riemannian_adam"
    geometry = [] if "--geometry" in argv else ["--geometry", "stiefel_pair"]
    assert main(["conform", target, *geometry, *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_command_on_a_factored_geometry(capsys) -> None:
    argv = ["conform", f"{TARGETS}:rsgd", "--geometry", "fixed_rank_quotient", "--rule", "rsgd"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["geometry"] == "fixed_rank_quotient"
    assert report["passed"] and report["first_departure_step"] is None
