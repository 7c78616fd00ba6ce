"""`rattn rank` at the detection edge, against established rank estimators (docs/entropic_bound.md
§4.2).

Planted tasks of ``reference.capacity.tasks`` (flat planted spectra; n = d = d_v): static mixing,
linear QK attention, softmax attention with K = UVᵀ and with a PSD K = UUᵀ; r* ∈ ``ranks``,
S ∈ ``sequences``; per cell ``seeds`` data sets. The signal strength κ is in units of the
detection edge of the operator each estimator reads, κ = 1 at the edge
(``reference.capacity.strength``: the Gram's spike over the BBP edge for static mixing, the
coefficient's weakest planted singular value over the median of ‖Ĉ − E Ĉ‖₂ for attention).

"default" is the generators' default noise σ = 0.01, where the finite-n tail of EB-7 is above
the noise. Estimators: ``rattn`` (``reference.capacity.recommend.estimate``, the command's
own code), Gavish–Donoho's optimal hard threshold with the noise level known (static: σ;
attention: the sandwich standard error per entry) and unknown (median singular value), Minka's MLE
(``sklearn.decomposition.PCA(n_components="mle")``: static on the tokens × outputs matrix,
attention on Ĉ's rows), a permutation null of the largest value (static: each token's outputs
permuted; attention: Y permuted across sequences and refitted), parallel analysis (static only:
Horn's sequential rule on the same permutations) and the largest eigengap without a floor.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from reference import capacity
from reference.capacity import recommend, strength
from torch_port.experiments import attention_students as st
from torch_port.experiments.common import RunOptions, figure, markdown_table

NAME = "rank-edge"
KINDS = strength.KINDS
ESTIMATORS = (
    "rattn",
    "gavish_donoho_known",
    "gavish_donoho_unknown",
    "minka",
    "permutation_null",
    "parallel_analysis",
    "eigengap",
)
PEERS = ESTIMATORS[1:]
#: The caveats of ``rattn rank`` whose hit rates are reported: kind -> a phrase of its text.
CAVEATS = {
    "a counted value near the threshold": "less than",
    "values after the gap above the floor": "after the gap",
    "softmax: K not identifiable by inversion (n > d_v)": "cannot identify K",
}
#: The rule of the verdict: at every κ ≥ KAPPA_MIN, rattn's exact recoveries ≥ the best peer's
#: and its over-counts ≤ OVER_MAX of the runs; at the default noise, rattn's recovery = 1; on
#: noise alone (κ = NOISE, r* = 0), rattn answers > 0 in ≤ OVER_MAX of the runs. The best peer is
#: taken over the peers that also answer > 0 in ≤ OVER_MAX of the noise-only runs of the same
#: kind and S (a peer that cannot answer 0, such as scikit-learn's Minka MLE, recovers r* = 1
#: without detecting anything).
KAPPA_MIN, OVER_MAX = 2.0, 0.05
#: The κ of the noise-only cells: Y independent of X (r* = 0).
NOISE = "noise"
#: The ``rattn rank --attention`` of each kind.
ATTENTION = {"static": "static", "linear": "linear", "softmax": "softmax", "softmax-psd": "softmax"}

_GRID = dict(n=16, d=16, kinds=list(KINDS), ranks=[1, 3, 8], sequences=[50, 2000])
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        n=8,
        d=8,
        kinds=["static", "linear", "softmax"],
        ranks=[2],
        sequences=[60],
        kappas=[NOISE, 2.0, "default"],
        permutations=5,
        threads=1,
        seeds=[0, 1],
    ),
    "quick": dict(
        **_GRID, kappas=[NOISE, 2.0, 4.0, "default"], permutations=20, threads=1, seeds=[0, 1, 2]
    ),
    "paper": dict(
        **_GRID,
        kappas=[NOISE, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, "default"],
        permutations=30,
        threads=1,
        seeds=list(range(20)),
    ),
}


def check_config(config: Mapping[str, Any]) -> None:
    """Refuse a configuration that cannot run, naming the offending value."""
    n, d = config["n"], config["d"]
    if n < 2 or d < 1:
        raise ValueError(f"needs n ≥ 2 and d ≥ 1, got n = {n}, d = {d}")
    bad = [k for k in config["kinds"] if k not in KINDS]
    if bad or not config["kinds"]:
        raise ValueError(f"kinds must be among {KINDS}, got {config['kinds']}")
    bad = [r for r in config["ranks"] if not 1 <= r < min(n, d)]
    if bad or not config["ranks"]:
        raise ValueError(f"ranks must be in 1…{min(n, d) - 1}, got {config['ranks']}")
    bad = [s for s in config["sequences"] if s <= d]
    if bad or not config["sequences"]:
        raise ValueError(f"sequences must exceed d = {d} (softmax), got {config['sequences']}")
    bad = [
        k
        for k in config["kappas"]
        if k not in ("default", NOISE) and not (k > 0 and math.isfinite(k))
    ]
    if bad or not config["kappas"]:
        raise ValueError(
            f"kappas must be positive numbers, 'default' or {NOISE!r}, got {config['kappas']}"
        )
    if config["permutations"] < 2:
        raise ValueError(f"permutations must be ≥ 2, got {config['permutations']}")


# ---------------------------------------------------------------------------------------------
# Data at a given κ
# ---------------------------------------------------------------------------------------------
def noise_for(kind: str, kappa: float | str, s: int, n: int, d: int, r: int) -> float | None:
    """The noise σ at which the cell has signal strength κ (``strength.noise_at``; "default":
    the generators' 0.01; "noise": 1, the noise-only cells' outputs; None: κ cannot be
    reached)."""
    if kappa == "default":
        return 0.01
    if kappa == NOISE:
        return 1.0
    return strength.noise_at(kind, float(kappa), s, n, d, r)


# ---------------------------------------------------------------------------------------------
# Peers
# ---------------------------------------------------------------------------------------------
def gd_lambda(beta: float) -> float:
    """Gavish–Donoho's optimal hard threshold, noise known: λ*(β) = √(2(β + 1) + 8β/(β + 1 +
    √(β² + 14β + 1))), the threshold λ*·√N·σ for an M × N matrix (β = M/N ≤ 1)."""
    return math.sqrt(2 * (beta + 1) + 8 * beta / (beta + 1 + math.sqrt(beta**2 + 14 * beta + 1)))


def gd_omega(beta: float) -> float:
    """Gavish–Donoho's threshold with the noise unknown: ω(β)·median(σ), ω(β) ≈ 0.56β³ − 0.95β²
    + 1.82β + 1.43 (their approximation)."""
    return 0.56 * beta**3 - 0.95 * beta**2 + 1.82 * beta + 1.43


def _gd(sv: np.ndarray, shape: tuple[int, int], tau: float) -> tuple[int, int]:
    m, big = min(shape), max(shape)
    beta = m / big
    known = int(np.sum(sv > gd_lambda(beta) * math.sqrt(big) * tau))
    unknown = int(np.sum(sv > gd_omega(beta) * np.median(sv)))
    return known, unknown


def _minka(rows: np.ndarray) -> int:
    from sklearn.decomposition import PCA

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return int(PCA(n_components="mle", svd_solver="full").fit(rows).n_components_)


def _static_peers(t, permutations: int, rng: np.random.Generator) -> dict[str, int]:
    s, n, dv = t.y.shape
    flat = np.swapaxes(t.y, 0, 1).reshape(n, s * dv)
    sv = np.linalg.svd(flat, compute_uv=False)
    known, unknown = _gd(sv, flat.shape, t.noise)
    lam = sv**2 / (s * dv)
    null = np.array(
        [
            np.linalg.svd(rng.permuted(flat, axis=1), compute_uv=False) ** 2 / (s * dv)
            for _ in range(permutations)
        ]
    )
    above = lam > np.quantile(null, 0.95, axis=0)
    return {
        "gavish_donoho_known": known,
        "gavish_donoho_unknown": unknown,
        "minka": _minka(flat.T),
        "permutation_null": int(np.sum(lam > np.quantile(null[:, 0], 0.95))),
        "parallel_analysis": int(np.argmin(above)) if not above.all() else n,
        "eigengap": capacity.largest_gap_rank(lam),
    }


def _refit(kind: str, t, rng: np.random.Generator) -> np.ndarray:
    """The coefficient refitted with the outputs of the sequences permuted (no x–y link)."""
    shuffled = dataclasses.replace(t, y=t.y[rng.permutation(len(t.y))])
    return strength.coefficient(kind, shuffled).coef


def _attention_peers(kind: str, t, permutations: int, rng: np.random.Generator) -> dict:
    reg = strength.coefficient(kind, t)
    sv = capacity.singular_values(reg.coef)
    known, unknown = _gd(sv, reg.coef.shape, reg.stderr / math.sqrt(reg.coef.size))
    null = [float(capacity.singular_values(_refit(kind, t, rng))[0]) for _ in range(permutations)]
    return {
        "gavish_donoho_known": known,
        "gavish_donoho_unknown": unknown,
        "minka": _minka(reg.coef),
        "permutation_null": int(np.sum(sv > np.quantile(null, 0.95))),
        "parallel_analysis": None,
        "eigengap": capacity.largest_gap_rank(sv),
    }


# ---------------------------------------------------------------------------------------------
# Cells
# ---------------------------------------------------------------------------------------------
def cells_of(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One data set per cell: kind, r*, S, κ, seed (κ that cannot be reached is left out; the
    noise-only cells have r* = 0, one per kind and S)."""
    n, d = config["n"], config["d"]
    cells = []
    for kind in config["kinds"]:
        if NOISE in config["kappas"]:
            for s in config["sequences"]:
                cells += [dict(kind=kind, r=0, S=s, kappa=NOISE, seed=i) for i in config["seeds"]]
        for r in config["ranks"]:
            for s in config["sequences"]:
                for kappa in config["kappas"]:
                    if kappa == NOISE or noise_for(kind, kappa, s, n, d, r) is None:
                        continue
                    for seed in config["seeds"]:
                        cells.append(dict(kind=kind, r=r, S=s, kappa=kappa, seed=seed))
    return cells


def data_cell(config: Mapping[str, Any], cell: Mapping[str, Any]) -> dict[str, Any]:
    """Every estimator's answer on one data set, and the caveats ``rattn rank`` printed."""
    kind, r, s, kappa, seed = (cell[k] for k in ("kind", "r", "S", "kappa", "seed"))
    n, d = config["n"], config["d"]
    noise = noise_for(kind, kappa, s, n, d, r)
    tag = KINDS.index(kind)
    rng = np.random.default_rng([seed, tag, r, s])
    if kappa == NOISE:  # the tokens of a rank-1 task, outputs independent of them (r* = 0)
        t = strength.planted(kind, s, n, d, 1, noise, rng)
        t = dataclasses.replace(t, y=rng.standard_normal(t.y.shape), rank=0)
    else:
        t = strength.planted(kind, s, n, d, r, noise, rng)
    report = recommend.estimate(t.x, t.y, ATTENTION[kind])
    rng = np.random.default_rng([seed, tag, r, s, 1])
    if kind == "static":
        peers = _static_peers(t, config["permutations"], rng)
    else:
        peers = _attention_peers(kind, t, config["permutations"], rng)
    return {
        **dict(cell),
        "noise": noise,
        "answers": {"rattn": report["recommended_rank"], **peers},
        "caveats": report["caveats"],
    }


def work(config: Mapping[str, Any]) -> Any:
    """The function computing one cell of ``cells_of(config)``."""
    return functools.partial(data_cell, config)


# ---------------------------------------------------------------------------------------------
# Summary, tables, plots
# ---------------------------------------------------------------------------------------------
def _key(run: Mapping[str, Any]) -> tuple:
    return run["kind"], run["r"], run["S"], str(run["kappa"])


def _rates(cell: list[dict[str, Any]], r: int) -> dict[str, dict[str, float]]:
    """Each estimator's rates of exact recovery, over-counting and answering 0 in one cell."""
    rates = {}
    for name in ESTIMATORS:
        answers = [c["answers"][name] for c in cell]
        if any(a is None for a in answers):
            continue
        rates[name] = {
            "exact": float(np.mean([a == r for a in answers])),
            "over": float(np.mean([a > r for a in answers])),
            "zero": float(np.mean([a == 0 for a in answers])),
        }
    return rates


def summarize(config: Mapping[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (kind, r*, S, κ): each estimator's exact-recovery and over-count rates, the best
    eligible peer (the rule above ``KAPPA_MIN, OVER_MAX``), and the verdict by that rule; the
    near-threshold caveat's hit rates."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(_key(run), []).append(run)
    rates_of = {key: _rates(cell, key[1]) for key, cell in groups.items()}
    rows = []
    for (kind, r, s, kappa), cell in groups.items():
        rates = rates_of[(kind, r, s, kappa)]
        noise_only = rates_of.get((kind, 0, s, NOISE), {})
        eligible = [
            p
            for p in PEERS
            if p in rates
            and (not noise_only or (p in noise_only and noise_only[p]["over"] <= OVER_MAX))
        ]
        best = max((rates[p]["exact"] for p in eligible), default=0.0)
        mine = rates["rattn"]
        judged = kappa in ("default", NOISE) or float(kappa) >= KAPPA_MIN
        if kappa == "default":
            ok = mine["exact"] == 1.0
        elif kappa == NOISE:
            ok = mine["over"] <= OVER_MAX
        else:
            ok = mine["exact"] >= best and mine["over"] <= OVER_MAX
        rows.append(
            {
                "kind": kind,
                "r": r,
                "S": s,
                "kappa": kappa,
                "runs": len(cell),
                "noise": cell[0]["noise"],
                "rates": rates,
                "best_peer": best,
                "eligible_peers": eligible,
                "judged": judged,
                "meets_rule": ok if judged else None,
            }
        )
    caveats = {}
    for kind, phrase in CAVEATS.items():
        fired: dict[str, list[bool]] = {"right": [], "wrong": []}
        for run in runs:
            answer = "right" if run["answers"]["rattn"] == run["r"] else "wrong"
            fired[answer].append(any(phrase in c for c in run["caveats"]))
        caveats[kind] = {k: (float(np.mean(v)) if v else None, len(v)) for k, v in fired.items()}
    judged = [row for row in rows if row["judged"]]
    return {
        "rows": rows,
        "caveats": caveats,
        "cells_judged": len(judged),
        "cells_meeting_rule": sum(bool(row["meets_rule"]) for row in judged),
        "datasets": len(runs),
    }


def markdown(config: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """results.md: one row per cell, exact recovery / over-count of every estimator."""
    head = (
        f"# rattn rank at the detection edge (n = {config['n']}, d = d_v = {config['d']}, "
        f"flat spectra, seeds {config['seeds']})\n\n"
        f"Rule: at every κ ≥ {KAPPA_MIN:g}, rattn's exact recovery ≥ the best peer's and "
        f"over-counting ≤ {OVER_MAX:.0%}; at the default noise, recovery 1.00; on noise alone "
        f"(κ = {NOISE}, r* = 0), a count > 0 in ≤ {OVER_MAX:.0%} of runs. The best peer is "
        f"taken over the peers that also count > 0 in ≤ {OVER_MAX:.0%} of the noise-only runs "
        "of the same kind and S. Cells meeting it: "
        f"{summary['cells_meeting_rule']} of {summary['cells_judged']} "
        f"({summary['datasets']} data sets).\n\n"
        "Each entry: exact recovery / over-count rate.\n\n"
    )
    names = list(ESTIMATORS)
    table = markdown_table(
        ["kind", "r*", "S", "κ", *names, "rule"],
        [
            [
                row["kind"],
                row["r"],
                row["S"],
                row["kappa"],
                *(
                    f"{row['rates'][e]['exact']:.2f}/{row['rates'][e]['over']:.2f}"
                    if e in row["rates"]
                    else "—"
                    for e in names
                ),
                "—" if not row["judged"] else ("meets" if row["meets_rule"] else "FAILS"),
            ]
            for row in summary["rows"]
        ],
    )
    fmt = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [
        "\n\nPeers left out of the best-peer comparison (a count > 0 on noise alone in more "
        f"than {OVER_MAX:.0%} of runs):\n"
    ]
    for row in summary["rows"]:
        if row["kappa"] == NOISE:
            out = [p for p in PEERS if p in row["rates"] and p not in row["eligible_peers"]]
            lines.append(f"- {row['kind']}, S = {row['S']}: {', '.join(out) or 'none'}")
    lines += ["\nHow often each caveat of `rattn rank` fired, on right and on wrong answers:\n"]
    for kind, rates in summary["caveats"].items():
        (right, nr), (wrong, nw) = rates["right"], rates["wrong"]
        lines.append(f"- {kind}: {fmt(right)} of {nr} right, {fmt(wrong)} of {nw} wrong")
    tail = "\n".join(lines) + "\n"
    return head + table + tail


def plots(directory, config: Mapping[str, Any], summary: Mapping[str, Any], runs) -> list[str]:
    """recovery.png: exact recovery against κ, one panel per kind (largest S, largest r*)."""
    kinds = list(config["kinds"])
    name = "recovery.png"
    s, r = max(config["sequences"]), max(config["ranks"])
    with figure(directory / name, ncols=len(kinds)) as axes:
        for ax, kind in zip(axes, kinds, strict=True):
            rows = [
                row
                for row in summary["rows"]
                if row["kind"] == kind
                and row["S"] == s
                and row["r"] == r
                and row["kappa"] not in ("default", NOISE)
            ]
            kappas = [float(row["kappa"]) for row in rows]
            for e in ESTIMATORS:
                values = [row["rates"].get(e, {}).get("exact") for row in rows]
                if kappas and None not in values:
                    ax.plot(kappas, values, marker="o", lw=2.5 if e == "rattn" else 1, label=e)
            ax.set_title(f"{kind}, r* = {r}, S = {s}")
            ax.set_xlabel("κ (1 = detection edge)")
            ax.set_ylabel("exact recovery")
        axes[0].legend(fontsize=6)
    return [name]


EXPERIMENT = st.StudentExperiment(
    NAME, PRESETS, check_config, cells_of, work, summarize, plots, markdown
)


def run(options: RunOptions) -> dict[str, Any]:
    """Run the comparison for the preset; write results.json, results.md and recovery.png."""
    return st.run_experiment(EXPERIMENT, options)


def format_summary(document: Mapping[str, Any]) -> str:
    """The verdict line and the cells that fail the rule."""
    s = document["summary"]
    lines = [
        f"rank-edge: {s['cells_meeting_rule']} of {s['cells_judged']} judged cells meet the rule "
        f"({s['datasets']} data sets)"
    ]
    for row in s["rows"]:
        if row["judged"] and not row["meets_rule"]:
            e = row["rates"]["rattn"]
            lines.append(
                f"  fails: {row['kind']} r*={row['r']} S={row['S']} κ={row['kappa']}: rattn "
                f"{e['exact']:.2f}/{e['over']:.2f}, best peer {row['best_peer']:.2f}"
            )
    return "\n".join(lines)


__all__ = ["PRESETS", "format_summary", "run"]
