"""Running the cases of ``rattn compare``: both trajectories, the measured amplification, the
deviation and drift of the port against their bounds (derivations in the package docstring and
in docs/torch_port.md)."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from proofs_checks.port_compare.geometries import unit_roundoff
from proofs_checks.port_compare.problems import PROBLEMS, Instance, Problem
from proofs_checks.port_compare.rules import RECORDS, RULES, Record, Rule
from reference.environment import environment

Tensor = torch.Tensor

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
}
DEVICES = ("cpu", "cuda")

#: Local error of one port step, in units of roundoff of its dtype (package docstring).
LOCAL_ERROR_ULPS = 90.0

#: Size of the perturbation of the starting points that measures the amplification S.
PERTURBATION = 1e-7

#: Measured envelopes used where the a priori deviation bound is vacuous (≥ the diameter
#: 2·sqrt(r) of the frame set): (dtype name, rule name) -> max ‖W_port − W_ref‖_F allowed after
#: ENVELOPE_STEPS steps, scaled by N/ENVELOPE_STEPS for longer runs (the measured deviation grows
#: about linearly). Set from the Stiefel problems over seeds 0–9 on CPU (worst measured, both
#: problems: riemannian_adam 0.17, riemannian_momentum 0.22, rsgd 0.23, normalized_rsgd 0.26),
#: about 3× the worst, rounded up; docs/torch_port.md has the table.
ENVELOPES: dict[tuple[str, str], float] = {
    ("bfloat16", "riemannian_adam"): 0.6,
    ("bfloat16", "riemannian_momentum"): 0.7,
    ("bfloat16", "rsgd"): 0.7,
    ("bfloat16", "normalized_rsgd"): 0.8,
}
ENVELOPE_STEPS = 100
#: Steps per case of the quick table (``compare(full=False)``, ``rattn compare`` by default).
QUICK_STEPS = 20


# -- trajectories ---------------------------------------------------------------------------------
@dataclass
class ReferenceRun:
    """A reference trajectory: every element of the batch its own point with its own state."""

    instance: Instance
    adapter: Any
    rule: Rule
    arrays: list[np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        self.opt = self.rule.reference()
        self.arrays = [np.array(p, copy=True) for p in self.instance.points]
        elements = self.adapter.elements(self.arrays)
        self.geoms = [g for g, _ in elements]
        self.points = [x for _, x in elements]
        self.states = [self.opt.init(g, x) for g, x in elements]

    def step(self) -> list[Any]:
        grads = self.adapter.elements(self.instance.egrad(self.arrays, self.instance.data))
        for k, (g, (_, e)) in enumerate(zip(self.geoms, grads, strict=True)):
            self.points[k], self.states[k] = self.opt.step(g, self.points[k], e, self.states[k])
        self.arrays = self.adapter.assemble(self.points, self.arrays)
        return list(self.points)


def reference_trajectory(
    instance: Instance, adapter: Any, rule: Rule, steps: int
) -> list[list[Any]]:
    """The reference's points (one per element) after each of ``steps`` steps."""
    run = ReferenceRun(instance, adapter, rule)
    return [run.step() for _ in range(steps)]


def _flat(adapter: Any, point: Any) -> np.ndarray:
    return np.concatenate([np.ravel(p) for p in adapter.compared(point)])


def _deviations(adapter: Any, a: Sequence[Any], b: Sequence[Any]) -> list[float]:
    """‖a_k − b_k‖_F element by element, on what the adapter compares."""
    return [
        float(np.linalg.norm(_flat(adapter, x) - _flat(adapter, y)))
        for x, y in zip(a, b, strict=True)
    ]


def distance(adapter: Any, a: Sequence[Any], b: Sequence[Any]) -> float:
    """The Frobenius distance over all elements together."""
    return math.sqrt(sum(d * d for d in _deviations(adapter, a, b)))


def amplification(
    instance: Instance,
    adapter: Any,
    rule: Rule,
    steps: int,
    reference: list[list[Any]],
    seed: int = 0,
) -> float:
    """S = max_t ‖W'_t − W_t‖/‖W'_0 − W_0‖ for a reference run from W'_0 = points
    ``PERTURBATION`` away from the starting points (float64): how much the trajectory map
    amplifies an early error (first-order; measured, not assumed)."""
    rng = np.random.default_rng(10_000 + seed)
    elements = adapter.elements(instance.points)
    start = [adapter.perturb(g, x, rng, PERTURBATION) for g, x in elements]
    d0 = distance(adapter, start, [x for _, x in elements])
    moved = Instance(
        adapter.assemble(start, instance.points), instance.data, instance.egrad, instance.loss
    )
    other = reference_trajectory(moved, adapter, rule, steps)
    return max(distance(adapter, a, b) for a, b in zip(other, reference, strict=True)) / d0


def _to_numpy(t: Tensor) -> np.ndarray:
    """A float64 NumPy copy (``.numpy()`` of a CPU float64 tensor shares its memory, and the
    optimizer updates parameters in place)."""
    return np.array(t.detach().to(device="cpu", dtype=torch.float64).numpy(), copy=True)


def port_trajectory(
    instance: Instance,
    adapter: Any,
    rule: Rule,
    steps: int,
    dtype: torch.dtype,
    device: str,
) -> tuple[list[Any], list[list[Any]]]:
    """(starting points as stored, points after each step) of the port, read back in float64,
    as the reference's elements."""
    params = [
        torch.nn.Parameter(torch.tensor(p, dtype=torch.float64).to(device=device, dtype=dtype))
        for p in instance.points
    ]
    data = {
        k: torch.tensor(v, dtype=torch.float64).to(device=device, dtype=dtype)
        for k, v in instance.data.items()
    }
    opt = rule.port([adapter.group(params)])

    def read() -> list[Any]:
        return [x for _, x in adapter.elements([_to_numpy(p) for p in params])]

    start, out = read(), []
    for _ in range(steps):
        opt.zero_grad()
        instance.loss(params, data).backward()
        opt.step()
        out.append(read())
    return start, out


# -- one case -------------------------------------------------------------------------------------
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
    adapter = problem.adapter
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
    origin = [x for _, x in adapter.elements(instance.points)]
    initial = max(_deviations(adapter, start, origin))
    deviations = [max(_deviations(adapter, a, b)) for a, b in zip(port, reference, strict=True)]
    max_dev = max(deviations)
    u = unit_roundoff(dtype)
    scale = max(adapter.scale(x) for xs in reference for x in xs)
    a_priori = max(1.0, amp) * (initial + steps * LOCAL_ERROR_ULPS * u * scale)
    diameter = min(adapter.diameter(x) for x in origin)
    # the envelopes were measured on the Stiefel problems: they say nothing about the ten
    envelope = ENVELOPES.get((dtype_name, rule.name)) if problem.geometry == "stiefel" else None
    if a_priori < diameter:
        dev_bound, dev_kind = a_priori, "a priori"
    elif envelope is not None:
        dev_bound = envelope * max(1.0, steps / ENVELOPE_STEPS)
        dev_kind = "envelope" if dev_bound < diameter else "vacuous"
    else:
        dev_bound, dev_kind = a_priori, "vacuous"
    drifts = [adapter.residual(x) for x in port[-1]]
    drift = None if drifts[0] is None else max(drifts)
    ref_drift = None if drift is None else max(adapter.residual(x) for x in reference[-1])
    bounds = [adapter.drift_bound(x, dtype) for x in origin]
    drift_bound = None if None in bounds else max(bounds)
    dev_ok = max_dev <= dev_bound
    drift_ok = None if drift is None or drift_bound is None else drift <= drift_bound
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
        "compared": "W" if adapter.compares_matrix else "point",
        "amplification": amp,
        "scale": scale,
        "a_priori_deviation_bound": a_priori,
        "diameter": diameter,
        "deviation_bound": dev_bound,
        "deviation_bound_kind": dev_kind,
        "final_drift": drift,
        "reference_drift": ref_drift,
        "drift_bound": drift_bound,
        "deviation_passed": dev_ok,
        "drift_passed": drift_ok,
        "passed": dev_ok and drift_ok is not False,
    }


BOUND_NOTES = [
    "u_w: unit roundoff of the dtype (float64 1.1e-16, float32 6.0e-8, bfloat16 3.9e-3).",
    f"deviation bound (a priori) = max(1, S)·(e_0 + N·{LOCAL_ERROR_ULPS:g}·u_w·s): N steps, a "
    f"local error of {LOCAL_ERROR_ULPS:g} units of roundoff per port step (float64: 1e-14) "
    "relative to the size s = max(1, ‖W‖_F/sqrt(r)) of the points (1 for a frame), "
    "e_0 the rounding of the starting frames to the dtype, S the measured amplification of "
    f"a {PERTURBATION:g} perturbation of the start by the float64 reference trajectory.",
    "when the a priori bound reaches the diameter (2·sqrt(r) for St(d, r)) it is vacuous "
    "(bfloat16: N·90·u_w = 35 at N = 100); a measured envelope (Stiefel only; ENVELOPES "
    "in this module, about 3× "
    f"the worst of seeds 0–9 at {ENVELOPE_STEPS} steps, scaled by N/{ENVELOPE_STEPS} beyond) is "
    "checked instead and the case is marked 'envelope' ('vacuous' when neither bound is below "
    "the diameter: such a case cannot fail).",
    "drift bound = 4r(r + 1)·u_w + 2(d + r)r·u_float64 per orthonormal factor of d rows, for "
    "retractions that end in the polar factor (float64 Gram): it is re-formed at every step, so "
    "drift does not accumulate (proofs_checks/port_compare/geometries.py); other retractions "
    "(QR, SVD, exp) and R2 (no orthonormal factor) report the drift without a bound ('—').",
    "compared: the point itself ('point': a frame, the factors of P1 and P3) or the represented "
    "matrix W = A Bᵀ ('W': R1, whose factors represent W up to GL(r) moves, and the quotients "
    "R2 and P2).",
]


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.1e}"


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


def records(
    geometries: Sequence[str] | None = None,
    rules: Sequence[str] | None = None,
    problems: Sequence[str] | None = None,
) -> list[Record]:
    """The rows of ``RECORDS`` for the given geometries, rules and problems (all by default)."""
    chosen = {(p.geometry, p.name) for p in select(geometries, problems)}
    rule_names = list(RULES) if rules is None else list(rules)
    unknown = [r for r in rule_names if r not in RULES]
    if unknown:
        raise ValueError(f"unknown rule {', '.join(unknown)}; choose from {', '.join(RULES)}")
    return [r for r in RECORDS if (r.geometry, r.problem) in chosen and r.rule in rule_names]


def compare(
    device: str = "cpu",
    dtypes: Sequence[str] = ("float64", "float32", "bfloat16"),
    steps: int | None = None,
    seed: int = 0,
    geometries: Sequence[str] | None = None,
    rules: Sequence[str] | None = None,
    problems: Sequence[str] | None = None,
    *,
    full: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Run the selected records of ``RECORDS`` in each of their dtypes that ``dtypes`` names;
    returns one JSON-ready document ``{"passed", "full", "device", "steps", "seed", "cases":
    [...], "bounds": [...], "environment"}``.

    ``full``: every record, ``steps`` steps each (default each record's own, 100 or 50). Else
    the quick table: each (geometry, rule) once, with its first problem, ``steps`` steps each
    (default ``QUICK_STEPS``): every geometry, rule and dtype, in a fraction of the time."""
    check_device(device)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"unknown dtype {', '.join(bad)}; choose from {', '.join(DTYPES)}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be an integer ≥ 1, got {steps!r}")
    rows = records(geometries, rules, problems)
    if not full:
        first: dict[tuple[str, str], Record] = {}
        for row in rows:
            first.setdefault((row.geometry, row.rule), row)
        rows = list(first.values())
        steps = QUICK_STEPS if steps is None else steps
    cache: dict = {}
    todo = [(row, dt) for row in rows for dt in row.dtypes if dt in dtypes]
    cases = [
        run_case(
            PROBLEMS[row.geometry][row.problem],
            RULES[row.rule],
            dt,
            device,
            row.steps if steps is None else steps,
            seed,
            _cache=cache,
        )
        for row, dt in tqdm(
            todo, desc="rattn compare", unit="case", file=sys.stderr, disable=not progress
        )
    ]
    used = {row.rule for row in rows}
    return {
        "passed": all(c["passed"] for c in cases),
        "full": full,
        "device": device,
        "steps": steps,
        "seed": seed,
        "cases": cases,
        "rules": {r: RULES[r].description for r in RULES if r in used},
        "problems": {
            f"{p.geometry}/{p.name}": p.description
            for p in select(geometries, problems)
            if any((row.geometry, row.problem) == (p.geometry, p.name) for row in rows)
        },
        "bounds": BOUND_NOTES,
        "environment": environment(
            "torch",
            device=device,
            **({"cuda_device": torch.cuda.get_device_name()} if device == "cuda" else {}),
        ),
    }


def steps_text(steps: int | None) -> str:
    return "each case's own number of steps" if steps is None else f"{steps} steps"


def format_table(result: dict[str, Any]) -> str:
    """Markdown table of a ``compare`` result, with the bound notes and the verdict."""
    lines = [
        f"Port against reference, {steps_text(result['steps'])}, device {result['device']}, "
        f"seed {result['seed']}:",
        "",
        "| geometry | problem | rule | dtype | max ‖x_port − x_ref‖ | bound | S "
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
            f"| {c['amplification']:.2f} | {_num(c['final_drift'])} | {_num(c['drift_bound'])} "
            f"| {verdict} |"
        )
    failed = sum(not c["passed"] for c in result["cases"])
    lines += ["", *(f"- {n}" for n in BOUND_NOTES), ""]
    lines.append(
        "PASSED" if result["passed"] else f"FAILED: {failed} of {len(result['cases'])} cases"
    )
    return "\n".join(lines)
