"""The reports of the attention-native rank experiment (``native_rank``): its summary over
seeds, results.md and plots, from the cells of ``native_rank_cells``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from torch_port.experiments import attention_students as st
from torch_port.experiments.common import figure, markdown_table
from torch_port.experiments.native_rank_cells import KINDS, SHAPES


def eckart_young(r_star: int, rank: int) -> float:
    """Relative excess of the best rank-r approximation of a flat rank-r* kernel: (r* − r)₊/r*."""
    return max(r_star - rank, 0) / r_star


def summarize(config: Mapping[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Deficiency curves, plateau ranks, recovery estimators and frontier rows (mean, min, max
    over seeds; ``recovered_seeds`` counts seeds whose estimate equals r*)."""
    r = config["r_star"]
    students = [c for c in runs if c["type"] == "student"]
    deficiency: dict[str, Any] = {}
    recovery: dict[str, Any] = {}
    for kind in KINDS:
        mine = [c for c in students if c["kind"] == kind]
        ranks = sorted({c["rank"] for c in mine})
        per_rank = {k: [c for c in mine if c["rank"] == k] for k in ranks}
        knees = st.plateau_ranks(mine, config["seeds"], config["plateau_tol"])
        deficiency[kind] = {
            "ranks": ranks,
            "excess": [st.spread([c["excess"] for c in per_rank[k]]) for k in ranks],
            "mse": [st.spread([c["mse"] for c in per_rank[k]]) for k in ranks],
            "floor": st.spread([c["floor"] for c in mine]),
            "eckart_young": [eckart_young(r, k) for k in ranks],
            "plateau_rank": knees,
            "plateau_recovered_seeds": sum(k == r for k in knees),
        }
        full = [c for c in runs if c["type"] == "recovery" and c["kind"] == kind]
        recovery[kind] = {
            "estimators": {e: st.spread([c["estimators"][e] for c in full]) for e in st.ESTIMATORS},
            "recovered_seeds": {
                e: sum(c["estimators"][e] == r for c in full)
                for e in ("r_0.9", "r_0.99", "gap", "num_rank(1e-2)")
            },
            "normalised_spectrum": [
                (np.asarray(c["kernel_spectrum"]) / c["kernel_spectrum"][0]).tolist() for c in full
            ],
            "excess": st.spread([c["excess"] for c in full]),
            "mse": st.spread([c["mse"] for c in full]),
            "steps": config["recovery_steps"],
        }
    frontier = []
    cells = [c for c in runs if c["type"] == "frontier"]
    keys = sorted({(c["kind"], c["shape"], c["n"], c["beta"] or 0.0) for c in cells})
    for kind, shape, n, beta in keys:
        group = [
            c
            for c in cells
            if (c["kind"], c["shape"], c["n"], c["beta"] or 0.0) == (kind, shape, n, beta)
        ]
        row = {
            "kind": kind,
            "shape": shape,
            "n": n,
            "beta": beta if kind == "softmax" else None,
            "sequences": group[0]["sequences"],
            "estimators": {
                e: st.spread([c["estimators"][e] for c in group]) for e in st.ESTIMATORS
            },
            "recovered_seeds": {
                e: sum(c["estimators"][e] == r for c in group) for e in ("r_0.9", "r_0.99", "gap")
            },
            "ratio": st.spread([c["ratio"] for c in group]),
            "seeds": len(group),
        }
        if kind == "linear":
            row["population_ratio"] = st.spread([c["population_ratio"] for c in group])
        frontier.append(row)
    return {"r_star": r, "deficiency": deficiency, "recovery": recovery, "frontier": frontier}


def markdown(config: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """results.md: deficiency, recovery and frontier tables."""
    r, d = config["r_star"], config["d"]
    out = [
        f"# Attention-native rank (r* = {r}, n = {config['n']}, d = d_v = {d}, K* = UVᵀ flat, "
        f"σ = {config['noise']}, β = {config['beta']}, seeds {config['seeds']})\n",
        f"Students: K = W_Q W_Kᵀ of rank r, W_V learned, Adam lr {config['lr']}, "
        f"{config['steps']} steps, init_std {config['init_std']}, "
        f"{config['train_sequences']} training / {config['test_sequences']} test sequences, "
        f"{config['dtype']}. Mean over seeds (min–max).\n",
        "## Deficiency and achievability: relative excess test risk against student rank\n",
    ]
    lin, soft = summary["deficiency"]["linear"], summary["deficiency"]["softmax"]
    rows = []
    for i, k in enumerate(lin["ranks"]):
        rows.append(
            [
                k,
                st.cell_text(lin["excess"][i]),
                f"{lin['eckart_young'][i]:.3f}",
                st.cell_text(lin["mse"][i]),
                st.cell_text(soft["excess"][i]),
                st.cell_text(soft["mse"][i]),
            ]
        )
    rows.append(
        ["noise floor", "0", "0", st.cell_text(lin["floor"]), "0", st.cell_text(soft["floor"])]
    )
    out.append(
        markdown_table(
            [
                "student rank r",
                "linear: rel. excess",
                "(r*−r)₊/r*",
                "linear: rel. test MSE",
                "softmax: rel. excess",
                "softmax: rel. test MSE",
            ],
            rows,
        )
    )
    out.append(
        f"\nPlateau rank (smallest r with relative excess ≤ {config['plateau_tol']}): linear "
        f"{lin['plateau_rank']}, softmax {soft['plateau_rank']}.\n"
    )
    out.append(
        f"## Recovery: full-rank student (r = d = {d}) from small initialisation, "
        f"{config['recovery_steps']} steps (not part of the deficiency curve)\n"
    )
    cols = ["num_rank(1e-3)", "num_rank(1e-2)", "r_0.9", "r_0.99", "gap", "erank_E", "erank_RV"]
    rows = []
    for kind, rec in summary["recovery"].items():
        spec = np.mean(rec["normalised_spectrum"], axis=0)[: r + 2]
        rows.append(
            [kind]
            + [
                st.cell_text(rec["estimators"][c], integer=c not in ("erank_E", "erank_RV"))
                for c in cols
            ]
            + [", ".join(f"{v:.3g}" for v in spec), st.cell_text(rec["excess"])]
        )
    out.append(markdown_table(["attention", *cols, "σ(K̂)/σ₁ (mean)", "rel. excess"], rows))
    out.append("\n## Data-only frontier (no training, W_V unknown)\n")
    out.append(
        "Linear: pooled regression; softmax: first-order estimator. "
        "Gap above max(noise edge, σ₁/n). "
        "Ratio = σ_{r*+1}/σ_{r*} of the coefficient (population: EB-7 closed form).\n"
    )
    cols = ["num_rank(1e-2)", "r_0.9", "r_0.99", "gap", "erank_E", "erank_RV"]
    rows = []
    for row in summary["frontier"]:
        pop = st.cell_text(row["population_ratio"]) if "population_ratio" in row else "–"
        rows.append(
            [row["kind"], row["shape"], row["n"], "–" if row["beta"] is None else row["beta"]]
            + [
                st.cell_text(row["estimators"][c], integer=c not in ("erank_E", "erank_RV"))
                for c in cols
            ]
            + [st.cell_text(row["ratio"]), pop]
        )
    out.append(
        markdown_table(["attention", "K*", "n", "β", *cols, "ratio", "population ratio"], rows)
    )
    return "\n".join(out) + "\n"


def plots(
    directory: Any,
    config: Mapping[str, Any],
    summary: Mapping[str, Any],
    runs: list[dict[str, Any]],
) -> list[str]:
    """risk_vs_rank.png, recovery.png (final spectra and σ_i(K̂) during training), frontier.png."""
    r, d = config["r_star"], config["d"]
    with figure(directory / "risk_vs_rank.png") as axes:
        ax = axes[0]
        for kind, s in summary["deficiency"].items():
            ranks = s["ranks"]
            ax.semilogy(
                ranks,
                [max(e["mean"], 1e-12) for e in s["excess"]],
                marker="o",
                label=f"{kind}: rel. excess",
            )
            ax.axhline(s["floor"]["mean"], ls=":", lw=1, color="C0" if kind == "linear" else "C1")
        ranks = summary["deficiency"]["linear"]["ranks"]
        ey = [eckart_young(r, k) for k in ranks if k < r]
        ax.semilogy([k for k in ranks if k < r], ey, "k--", label="(r*−r)/r*")
        ax.axvline(r, color="grey", ls=":", lw=1)
        ax.set(xlabel="student QK rank r", ylabel="relative excess test risk", title="deficiency")
        ax.legend(fontsize=7)
    with figure(directory / "recovery.png", ncols=2) as axes:
        first = config["seeds"][0]
        for kind in KINDS:
            for c in runs:
                if c["type"] == "recovery" and c["kind"] == kind:
                    s = np.asarray(c["kernel_spectrum"])
                    axes[0].semilogy(
                        np.arange(1, d + 1),
                        s / s[0],
                        marker=".",
                        alpha=0.6,
                        color="C0" if kind == "linear" else "C1",
                        label=kind if c["seed"] == first else None,
                    )
        axes[0].axvline(r, color="grey", ls=":", lw=1)
        axes[0].set(xlabel="index i", ylabel="σ_i(K̂)/σ_1", title="full-rank student: learned K̂")
        axes[0].legend(fontsize=8)
        for c in runs:
            if c["type"] == "recovery" and c["seed"] == first:
                steps = [h[0] for h in c["spectrum_history"]]
                vals = np.asarray([h[1] for h in c["spectrum_history"]])
                for i in range(vals.shape[1]):
                    axes[1].semilogy(
                        steps,
                        vals[:, i],
                        color="C0" if c["kind"] == "linear" else "C1",
                        lw=1,
                        label=c["kind"] if i == 0 else None,
                    )
        axes[1].set(
            xlabel="Adam step", ylabel="σ_i(K̂)", title=f"σ_i(K̂) during training (seed {first})"
        )
        axes[1].legend(fontsize=8)
    with figure(directory / "frontier.png", ncols=2) as axes:
        rows = summary["frontier"]
        for j, shape in enumerate(SHAPES):
            lin = [x for x in rows if x["kind"] == "linear" and x["shape"] == shape]
            ns = [x["n"] for x in lin]
            for key, what, style in (
                ("ratio", "measured", {"marker": "o"}),
                ("population_ratio", "population", {"ls": "--"}),
            ):
                axes[0].loglog(
                    ns,
                    [x[key]["mean"] for x in lin],
                    color=f"C{j}",
                    label=f"K* = {shape}, {what}",
                    **style,
                )
            for i, n in enumerate(config["frontier_n_softmax"]):
                soft = [
                    x
                    for x in rows
                    if x["kind"] == "softmax" and x["shape"] == shape and x["n"] == n
                ]
                axes[1].semilogx(
                    [x["beta"] for x in soft],
                    [x["ratio"]["mean"] for x in soft],
                    marker="o",
                    ls="-" if j == 0 else "--",
                    color=f"C{i}",
                    label=f"K* = {shape}, n = {n}",
                )
        ratio = "σ_(r*+1) / σ_r*"
        axes[0].set(xlabel="n", ylabel=ratio, title="linear QK: pooled regression")
        axes[1].set(xlabel="β", ylabel=ratio, title="softmax: first-order estimator")
        for ax, ticks in (
            (axes[0], config["frontier_n_linear"]),
            (axes[1], config["frontier_betas"]),
        ):
            ax.minorticks_off()
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        axes[0].legend(fontsize=7)
        axes[1].legend(fontsize=7)
    return ["risk_vs_rank.png", "recovery.png", "frontier.png"]
