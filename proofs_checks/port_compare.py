"""The port against the reference: seeded problems run through ``reference.optim`` (float64,
NumPy) and ``torch_port.optim`` (a chosen device and dtype), step by step (DESIGN §7;
``rattn compare``).

This is validation code: it imports ``reference`` (DESIGN §2 allows it here; the core modules of
``torch_port`` never do).

What is compared. For a problem (a loss on one or more frame parameters, each a batch of frames
(..., d, r)), a rule and a dtype, both sides start from the same float64 frames (the port's
rounded to its dtype) and take ``steps`` steps. The reference treats every frame as its own point
with its own optimizer state (``reference.optim`` preset, the Euclidean gradient computed in
NumPy); the port holds each parameter as one batched tensor in one parameter group of the
geometry (gradient by autograd, in the dtype, on the device). After every step the port's frames
are read back in float64 and compared frame by frame:

- ``max_deviation``: max over steps and frames of ‖W_port − W_ref‖_F;
- ``final_drift``: max over frames of ‖WᵀW − I‖_F of the port's last point, measured in float64
  from its stored entries.

Bounds (``deviation_bound``, ``drift_bound``; derivations in ``BOUND_NOTES`` and in
docs/torch_port.md). u_w is the unit roundoff of the dtype (float64 2^-53 ≈ 1.1e-16, float32
2^-24 ≈ 6.0e-8, bfloat16 2^-8 ≈ 3.9e-3), u that of float64.

- Deviation: each step of the port differs from the exact step from the same point by a local
  error of at most C·u_w (C = ``LOCAL_ERROR_ULPS`` = 90: O(d·r) products and sums of length ≤ d,
  one r×r eigendecomposition, the rounding of the new point; for float64 this is the 1e-14 per
  step of the agreement tests). Errors made at step k are carried to step N by the linearised
  trajectory map; its amplification is measured, not assumed: ``amplification`` S is
  max_t ‖ΔW_t‖/‖ΔW_0‖ for a reference run started 1e-7 away (float64, same rule). First-order
  propagation then gives ‖W_port − W_ref‖ ≤ max(1, S)·(e_0 + N·C·u_w), e_0 the initial rounding
  (0 in float64). In float64 with S ≤ 1 this is 1e-14 per step, 1e-12 after 100 steps
  (DESIGN §7). The bound is a priori only where it is informative: when it reaches the diameter
  of the frame set (2·sqrt(r): any two frames are that close), it says nothing, and a
  **measured envelope** (``ENVELOPES``, set from runs over seeds 0–9 with a factor of about 3
  and stated as such) is used instead; the case is then marked "envelope".
- Drift: the polar retraction re-forms the Gram of the stored W + ξ at every step, so rounding
  does not accumulate across steps; the last step leaves ‖WᵀW − I‖ ≤ 4r(r + 1)u_w + 2(d + r)r·u
  (the d×r product A·S with inner length r and the cast of S = (AᵀA)^{-1/2} to the dtype, plus
  the float64 Gram and eigendecomposition; a factor 2 for second-order terms).

Adding a geometry: register a ``GeometryAdapter`` in ``GEOMETRY_ADAPTERS`` (how the reference
builds one point from an array, how the port names its parameter group, how a point's residual
is measured) and problems for it with ``register_problem``; the rules, the runner and the CLI
pick them up by name.
"""

from __future__ import annotations

import math
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

import reference as ref
import torch_port as tp
from reference import optim as ref_optim

Tensor = torch.Tensor

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
}
DEVICES = ("cpu", "cuda")

#: Local error of one port step, in units of roundoff of its dtype (module docstring).
LOCAL_ERROR_ULPS = 90.0

#: Size of the perturbation of the starting frames that measures the amplification S.
PERTURBATION = 1e-7

#: Measured envelopes used where the a priori deviation bound is vacuous (≥ the diameter
#: 2·sqrt(r) of the frame set): (dtype name, rule name) -> max ‖W_port − W_ref‖_F allowed after
#: ENVELOPE_STEPS steps, scaled by N/ENVELOPE_STEPS for longer runs (the measured deviation grows
#: about linearly). Set from the default problems over seeds 0–9 on CPU (worst measured, both
#: problems: riemannian_adam 0.17, riemannian_momentum 0.22, rsgd 0.23, normalized_rsgd 0.26),
#: about 3× the worst, rounded up; docs/torch_port.md has the table.
ENVELOPES: dict[tuple[str, str], float] = {
    ("bfloat16", "riemannian_adam"): 0.6,
    ("bfloat16", "riemannian_momentum"): 0.7,
    ("bfloat16", "rsgd"): 0.7,
    ("bfloat16", "normalized_rsgd"): 0.8,
}
ENVELOPE_STEPS = 100


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = ε/2 of a floating dtype (float64 2^-53, float32 2^-24, bfloat16 2^-8)."""
    return torch.finfo(dtype).eps / 2.0


# -- geometries ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GeometryAdapter:
    """How the runner handles one geometry on both sides.

    ``reference(shape)`` builds the reference geometry of one point of that array shape;
    ``group(params)`` the port's parameter group for a list of batched parameters; ``residual``
    the constraint residual of one point (float64 NumPy); ``drift_bound(shape, dtype)`` the
    bound on it after a port step; ``diameter(shape)`` the largest distance between two
    points (∞ where unbounded); ``perturb(point, rng, size)`` a point near ``point``.
    """

    name: str
    reference: Callable[[tuple[int, ...]], Any]
    group: Callable[[list[Tensor]], dict[str, Any]]
    residual: Callable[[np.ndarray], float]
    drift_bound: Callable[[tuple[int, ...], torch.dtype], float]
    diameter: Callable[[tuple[int, ...]], float]
    perturb: Callable[[np.ndarray, np.random.Generator, float], np.ndarray]


def _stiefel_drift_bound(shape: tuple[int, ...], dtype: torch.dtype) -> float:
    d, r = shape[-2], shape[-1]
    return 4.0 * r * (r + 1) * unit_roundoff(dtype) + 2.0 * (d + r) * r * unit_roundoff(
        torch.float64
    )


def _stiefel_perturb(w: np.ndarray, rng: np.random.Generator, size: float) -> np.ndarray:
    z = rng.standard_normal(w.shape)
    return ref.linalg.polar(w + size * z / np.linalg.norm(z))


GEOMETRY_ADAPTERS: dict[str, GeometryAdapter] = {
    "stiefel": GeometryAdapter(
        name="stiefel",
        reference=lambda shape: ref.Stiefel(shape[-2], shape[-1]),
        group=lambda params: {"params": params, "geometry": "stiefel"},
        residual=ref.linalg.orthonormality_residual,
        drift_bound=_stiefel_drift_bound,
        diameter=lambda shape: 2.0 * math.sqrt(shape[-1]),
        perturb=_stiefel_perturb,
    ),
}


# -- problems -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instance:
    """One seeded instance of a problem.

    ``points``: the starting parameters (float64 arrays, each a batch of points (..., d, r));
    ``data``: the constant arrays of the loss; ``egrad(points, data)``: the Euclidean gradients
    in NumPy (the reference side); ``loss(params, data)``: the same loss in torch (the port
    side, differentiated by autograd), with ``data`` converted to the port's dtype and device.
    """

    points: list[np.ndarray]
    data: dict[str, np.ndarray]
    egrad: Callable[[list[np.ndarray], dict[str, np.ndarray]], list[np.ndarray]]
    loss: Callable[[list[Tensor], dict[str, Tensor]], Tensor]


@dataclass(frozen=True)
class Problem:
    name: str
    geometry: str
    description: str
    build: Callable[[int], Instance]


#: geometry name -> problem name -> Problem.
PROBLEMS: dict[str, dict[str, Problem]] = {}


def register_problem(problem: Problem) -> Problem:
    if problem.geometry not in GEOMETRY_ADAPTERS:
        raise ValueError(f"no geometry adapter for {problem.geometry!r}")
    PROBLEMS.setdefault(problem.geometry, {})[problem.name] = problem
    return problem


def _brockett(seed: int) -> Instance:
    """f(W) = Σ_b tr(W_bᵀ A_b W_b N) over a batch of two frames on St(8, 3): A_b symmetric with
    unit spectral norm, N = diag(1, 2, 3); ∇f = 2 A_b W_b N."""
    rng = np.random.default_rng(seed)
    d, r, batch = 8, 3, 2
    a = rng.standard_normal((batch, d, d))
    a = (a + np.swapaxes(a, -1, -2)) / 2.0
    a /= np.linalg.norm(a, 2, axis=(-2, -1))[:, None, None]
    n = np.diag(np.arange(1.0, r + 1.0))
    st = ref.Stiefel(d, r)
    w0 = np.stack([st.random_point(rng) for _ in range(batch)])

    def egrad(points, data):
        return [2.0 * data["a"] @ points[0] @ data["n"]]

    def loss(params, data):
        w = params[0]
        return torch.sum(w * (data["a"] @ w @ data["n"]))

    return Instance([w0], {"a": a, "n": n}, egrad, loss)


def _attention_logits(seed: int) -> Instance:
    """f(W_Q, W_K) = Σ_h ½‖X W_Q^h W_K^hᵀ Xᵀ/√r − L_h‖² for two heads, W_Q^h, W_K^h frames on
    St(8, 3), X six tokens of unit norm, L_h the logits of a teacher pair of frames (so the
    minimum is 0); E_h = X W_Q^h W_K^hᵀ Xᵀ/√r − L_h, ∇_Q = Xᵀ E_h X W_K^h/√r,
    ∇_K = Xᵀ E_hᵀ X W_Q^h/√r."""
    rng = np.random.default_rng(seed)
    d, r, heads, tokens = 8, 3, 2, 6
    st = ref.Stiefel(d, r)
    x = rng.standard_normal((tokens, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    s = math.sqrt(r)
    tq = np.stack([st.random_point(rng) for _ in range(heads)])
    tk = np.stack([st.random_point(rng) for _ in range(heads)])
    target = x @ tq @ np.swapaxes(tk, -1, -2) @ x.T / s
    wq = np.stack([st.random_point(rng) for _ in range(heads)])
    wk = np.stack([st.random_point(rng) for _ in range(heads)])

    def egrad(points, data):
        q, k = points
        x, lt = data["x"], data["target"]
        e = x @ q @ np.swapaxes(k, -1, -2) @ x.T / s - lt
        xex = x.T @ e @ x
        return [xex @ k / s, np.swapaxes(xex, -1, -2) @ q / s]

    def loss(params, data):
        q, k = params
        x = data["x"]
        e = x @ q @ k.transpose(-1, -2) @ x.T / s - data["target"]
        return 0.5 * torch.sum(e * e)

    return Instance([wq, wk], {"x": x, "target": target}, egrad, loss)


register_problem(
    Problem(
        "brockett",
        "stiefel",
        "Brockett cost Σ tr(WᵀAWN) on a batch of 2 frames of St(8, 3)",
        _brockett,
    )
)
register_problem(
    Problem(
        "attention_logits",
        "stiefel",
        "½‖X W_Q W_Kᵀ Xᵀ/√r − L‖² per head, 2 heads, W_Q, W_K frames of St(8, 3), 6 tokens",
        _attention_logits,
    )
)


# -- rules --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    reference: Callable[[], Any]
    port: Callable[[list[dict[str, Any]]], torch.optim.Optimizer]


#: lr of the normalized rule: its steps have fixed length lr·sqrt(d·r); at 1e-2 it reaches the
#: Brockett minimiser within ~55 steps and then oscillates, amplifying any perturbation ~8× per
#: step (docs/torch_port.md); at 2e-3 it stays in the contracting regime for 100 steps.
LR = 1e-2
LR_NORMALIZED = 2e-3

RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule(
            "riemannian_adam",
            f"lr {LR:g}, betas (0.9, 0.999), eps 1e-8, one √v per frame",
            lambda: ref_optim.riemannian_adam(lr=LR),
            lambda groups: tp.RiemannianAdam(groups, lr=LR),
        ),
        Rule(
            "riemannian_momentum",
            f"lr {LR:g}, beta 0.9, c 1",
            lambda: ref_optim.riemannian_momentum(lr=LR, beta=0.9, c=1.0),
            lambda groups: tp.RiemannianMomentum(groups, lr=LR, beta=0.9, c=1.0),
        ),
        Rule(
            "rsgd",
            f"lr {LR:g}",
            lambda: ref_optim.rsgd(lr=LR),
            lambda groups: tp.RSGD(groups, lr=LR),
        ),
        Rule(
            "normalized_rsgd",
            f"lr {LR_NORMALIZED:g}",
            lambda: ref_optim.normalized_rsgd(lr=LR_NORMALIZED),
            lambda groups: tp.NormalizedRSGD(groups, lr=LR_NORMALIZED),
        ),
    )
}


# -- the runner ---------------------------------------------------------------------------------
def _frames(array: np.ndarray) -> Iterable[tuple[int, ...]]:
    return np.ndindex(*array.shape[:-2])


@dataclass
class _ReferenceRun:
    """A reference trajectory: every frame its own point with its own optimizer state."""

    instance: Instance
    adapter: GeometryAdapter
    rule: Rule
    points: list[np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        self.opt = self.rule.reference()
        self.points = [p.copy() for p in self.instance.points]
        self.geoms = [self.adapter.reference(p.shape) for p in self.points]
        self.states = [
            {i: self.opt.init(g, p[i]) for i in _frames(p)}
            for g, p in zip(self.geoms, self.points, strict=True)
        ]

    def step(self) -> list[np.ndarray]:
        grads = self.instance.egrad(self.points, self.instance.data)
        new = []
        for g, p, e, states in zip(self.geoms, self.points, grads, self.states, strict=True):
            q = np.empty_like(p)
            for i in _frames(p):
                q[i], states[i] = self.opt.step(g, p[i], e[i], states[i])
            new.append(q)
        self.points = new
        return new


def reference_trajectory(
    instance: Instance, adapter: GeometryAdapter, rule: Rule, steps: int
) -> list[list[np.ndarray]]:
    """The reference's points after each of ``steps`` steps."""
    run = _ReferenceRun(instance, adapter, rule)
    return [run.step() for _ in range(steps)]


def _distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """Frobenius distance over all parameters and frames together."""
    return math.sqrt(sum(float(np.sum((x - y) ** 2)) for x, y in zip(a, b, strict=True)))


def _max_frame_deviation(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """max over parameters and frames of ‖A_i − B_i‖_F."""
    return max(
        float(np.max(np.sqrt(np.sum((x - y) ** 2, axis=(-2, -1)))))
        for x, y in zip(a, b, strict=True)
    )


def amplification(
    instance: Instance,
    adapter: GeometryAdapter,
    rule: Rule,
    steps: int,
    reference: list[list[np.ndarray]],
    seed: int = 0,
) -> float:
    """S = max_t ‖W'_t − W_t‖/‖W'_0 − W_0‖ for a reference run from W'_0 = a point
    ``PERTURBATION`` away from each starting frame (float64): how much the trajectory map
    amplifies an early error (first-order; measured, not assumed)."""
    rng = np.random.default_rng(10_000 + seed)
    start = []
    for p in instance.points:
        q = np.empty_like(p)
        for i in _frames(p):
            q[i] = adapter.perturb(p[i], rng, PERTURBATION)
        start.append(q)
    d0 = _distance(start, instance.points)
    moved = Instance(start, instance.data, instance.egrad, instance.loss)
    other = reference_trajectory(moved, adapter, rule, steps)
    return max(_distance(a, b) for a, b in zip(other, reference, strict=True)) / d0


def _to_numpy(t: Tensor) -> np.ndarray:
    """A float64 NumPy copy (``.numpy()`` of a CPU float64 tensor shares its memory, and the
    optimizer updates parameters in place)."""
    return np.array(t.detach().to(device="cpu", dtype=torch.float64).numpy(), copy=True)


def port_trajectory(
    instance: Instance,
    adapter: GeometryAdapter,
    rule: Rule,
    steps: int,
    dtype: torch.dtype,
    device: str,
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """(starting points as stored, points after each step) of the port, read back in float64."""
    params = [
        torch.nn.Parameter(torch.tensor(p, dtype=torch.float64).to(device=device, dtype=dtype))
        for p in instance.points
    ]
    data = {
        k: torch.tensor(v, dtype=torch.float64).to(device=device, dtype=dtype)
        for k, v in instance.data.items()
    }
    opt = rule.port([adapter.group(params)])
    start = [_to_numpy(p) for p in params]
    out = []
    for _ in range(steps):
        opt.zero_grad()
        instance.loss(params, data).backward()
        opt.step()
        out.append([_to_numpy(p) for p in params])
    return start, out


def run_case(
    problem: Problem,
    rule: Rule,
    dtype_name: str,
    device: str = "cpu",
    steps: int = 100,
    seed: int = 0,
    *,
    _cache: dict | None = None,
) -> dict[str, Any]:
    """One (problem, rule, dtype) case: deviation and drift against their bounds."""
    adapter = GEOMETRY_ADAPTERS[problem.geometry]
    dtype = DTYPES[dtype_name]
    instance = problem.build(seed)
    key = (problem.geometry, problem.name, rule.name, steps, seed)
    if _cache is not None and key in _cache:
        reference, amp = _cache[key]
    else:
        reference = reference_trajectory(instance, adapter, rule, steps)
        amp = amplification(instance, adapter, rule, steps, reference, seed)
        if _cache is not None:
            _cache[key] = (reference, amp)
    start, port = port_trajectory(instance, adapter, rule, steps, dtype, device)
    initial = _max_frame_deviation(start, instance.points)
    deviations = [_max_frame_deviation(a, b) for a, b in zip(port, reference, strict=True)]
    max_dev = max(deviations)
    u = unit_roundoff(dtype)
    a_priori = max(1.0, amp) * (initial + steps * LOCAL_ERROR_ULPS * u)
    diameter = min(adapter.diameter(p.shape) for p in instance.points)
    envelope = ENVELOPES.get((dtype_name, rule.name))
    if a_priori < diameter:
        dev_bound, dev_kind = a_priori, "a priori"
    elif envelope is not None:
        dev_bound = envelope * max(1.0, steps / ENVELOPE_STEPS)
        dev_kind = "envelope" if dev_bound < diameter else "vacuous"
    else:
        dev_bound, dev_kind = a_priori, "vacuous"
    drift = max(adapter.residual(p[i]) for p in port[-1] for i in _frames(p))
    ref_drift = max(adapter.residual(p[i]) for p in reference[-1] for i in _frames(p))
    drift_bound = max(adapter.drift_bound(p.shape, dtype) for p in instance.points)
    dev_ok = max_dev <= dev_bound
    drift_ok = drift <= drift_bound
    return {
        "geometry": problem.geometry,
        "problem": problem.name,
        "rule": rule.name,
        "dtype": dtype_name,
        "device": device,
        "steps": steps,
        "seed": seed,
        "initial_deviation": initial,
        "max_deviation": max_dev,
        "final_deviation": deviations[-1],
        "amplification": amp,
        "a_priori_deviation_bound": a_priori,
        "diameter": diameter,
        "deviation_bound": dev_bound,
        "deviation_bound_kind": dev_kind,
        "final_drift": drift,
        "reference_drift": ref_drift,
        "drift_bound": drift_bound,
        "deviation_passed": dev_ok,
        "drift_passed": drift_ok,
        "passed": dev_ok and drift_ok,
    }


BOUND_NOTES = [
    "u_w: unit roundoff of the dtype (float64 1.1e-16, float32 6.0e-8, bfloat16 3.9e-3).",
    f"deviation bound (a priori) = max(1, S)·(e_0 + N·{LOCAL_ERROR_ULPS:g}·u_w): N steps, a "
    f"local error of {LOCAL_ERROR_ULPS:g} units of roundoff per port step (float64: 1e-14), "
    "e_0 the rounding of the starting frames to the dtype, S the measured amplification of "
    f"a {PERTURBATION:g} perturbation of the start by the float64 reference trajectory.",
    "when the a priori bound reaches the diameter 2·sqrt(r) of St(d, r) it is vacuous (bfloat16: "
    "N·90·u_w = 35 at N = 100); a measured envelope (ENVELOPES in this module, about 3× "
    f"the worst of seeds 0–9 at {ENVELOPE_STEPS} steps, scaled by N/{ENVELOPE_STEPS} beyond) is "
    "checked instead and the case is marked 'envelope' ('vacuous' when neither bound is below "
    "the diameter: such a case cannot fail).",
    "drift bound = 4r(r + 1)·u_w + 2(d + r)r·u_float64: the polar retraction re-forms the "
    "Gram at every step, so drift does not accumulate (proofs_checks/port_compare.py docstring).",
]


def select(
    geometries: Sequence[str] | None = None, problems: Sequence[str] | None = None
) -> list[Problem]:
    """The registered problems of the given geometries (all by default), optionally by name."""
    names = list(PROBLEMS) if geometries is None else list(geometries)
    unknown = [g for g in names if g not in PROBLEMS]
    if unknown:
        raise ValueError(
            f"unknown geometry {', '.join(map(repr, unknown))}; problems are registered for "
            f"{', '.join(sorted(PROBLEMS))}"
        )
    chosen = [p for g in names for p in PROBLEMS[g].values()]
    if problems is not None:
        known = {p.name for p in chosen}
        bad = [p for p in problems if p not in known]
        if bad:
            raise ValueError(
                f"unknown problem {', '.join(map(repr, bad))}; choose from "
                f"{', '.join(sorted(known))}"
            )
        chosen = [p for p in chosen if p.name in problems]
    return chosen


def parse_dtypes(text: str) -> list[str]:
    """'float64,float32' -> ['float64', 'float32'] (ValueError naming the unknown ones)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in DTYPES]
    if not names or bad:
        raise ValueError(
            f"unknown dtype {', '.join(bad) or repr(text)}; choose from {', '.join(DTYPES)} "
            "(comma-separated)"
        )
    return list(dict.fromkeys(names))


def check_device(device: str) -> None:
    """ValueError for an unknown device or for cuda without CUDA."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "--device cuda was requested but CUDA is not available to this torch "
            f"({torch.__version__}); run with --device cpu"
        )


def compare(
    device: str = "cpu",
    dtypes: Sequence[str] = ("float64", "float32", "bfloat16"),
    steps: int = 100,
    seed: int = 0,
    geometries: Sequence[str] | None = None,
    rules: Sequence[str] | None = None,
    problems: Sequence[str] | None = None,
    *,
    progress: bool = False,
) -> dict[str, Any]:
    """Run every selected problem × rule × dtype; returns one JSON-ready document
    ``{"passed", "device", "steps", "seed", "cases": [...], "bounds": [...], "environment"}``."""
    check_device(device)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"unknown dtype {', '.join(bad)}; choose from {', '.join(DTYPES)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer ≥ 1, got {steps!r}")
    rule_names = list(RULES) if rules is None else list(rules)
    unknown = [r for r in rule_names if r not in RULES]
    if unknown:
        raise ValueError(f"unknown rule {', '.join(unknown)}; choose from {', '.join(RULES)}")
    cache: dict = {}
    todo = [(p, r, dt) for p in select(geometries, problems) for r in rule_names for dt in dtypes]
    cases = [
        run_case(problem, RULES[r], dt, device, steps, seed, _cache=cache)
        for problem, r, dt in tqdm(
            todo, desc="rattn compare", unit="case", file=sys.stderr, disable=not progress
        )
    ]
    return {
        "passed": all(c["passed"] for c in cases),
        "device": device,
        "steps": steps,
        "seed": seed,
        "cases": cases,
        "rules": {r: RULES[r].description for r in rule_names},
        "problems": {p.name: p.description for p in select(geometries, problems)},
        "bounds": BOUND_NOTES,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "device_name": (
                torch.cuda.get_device_name() if device == "cuda" else platform.processor()
            ),
        },
    }


def format_table(result: dict[str, Any]) -> str:
    """Markdown table of a ``compare`` result, with the bound notes and the verdict."""
    lines = [
        f"Port against reference, {result['steps']} steps, device {result['device']}, "
        f"seed {result['seed']}:",
        "",
        "| geometry | problem | rule | dtype | max ‖W_port − W_ref‖ | bound | S "
        "| ‖WᵀW − I‖ | bound | result |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for c in result["cases"]:
        verdict = "pass" if c["passed"] else "FAIL"
        if c["deviation_bound_kind"] != "a priori":
            verdict += f" ({c['deviation_bound_kind']})"
        lines.append(
            f"| {c['geometry']} | {c['problem']} | {c['rule']} | {c['dtype']} "
            f"| {c['max_deviation']:.1e} | {c['deviation_bound']:.1e} "
            f"| {c['amplification']:.2f} | {c['final_drift']:.1e} | {c['drift_bound']:.1e} "
            f"| {verdict} |"
        )
    failed = sum(not c["passed"] for c in result["cases"])
    lines += ["", *(f"- {n}" for n in BOUND_NOTES), ""]
    lines.append(
        "PASSED" if result["passed"] else f"FAILED: {failed} of {len(result['cases'])} cases"
    )
    return "\n".join(lines)


__all__ = [
    "DTYPES",
    "ENVELOPES",
    "GEOMETRY_ADAPTERS",
    "PROBLEMS",
    "RULES",
    "GeometryAdapter",
    "Instance",
    "Problem",
    "Rule",
    "compare",
    "format_table",
    "register_problem",
    "run_case",
]
