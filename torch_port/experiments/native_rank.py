"""Attention-native rank (Entropic Bound, background §5 and §6 P3/P4): the QK kernel rank.

Teachers are ``capacity.linear_qk_task`` and ``capacity.softmax_task`` (n tokens iid N(0, I_d),
K* = U Vᵀ of rank r* with a flat spectrum, W_V* = ``orthonormal(d, d_v)``, noise σ). Three parts:

1. **Deficiency and achievability.** Students ``attention_students.QKStudent`` with
   K = W_Q W_Kᵀ of rank r (W_Q, W_K ∈ ℝ^{d×r}, iid N(0, init_std²) entries) and a **learned** W_V
   (iid N(0, 1/d) entries), the teacher's attention kind and β, trained full batch with Adam
   (``lr``, ``steps``; float32 in smoke/quick, float64 in paper) on ``train_sequences``, for
   each r of ``ranks`` (all trained for ``steps``). Reported:
   the relative excess test risk ‖ŷ − y_clean‖²/‖y_clean‖² and the relative test MSE against r,
   with the relative noise floor. Linear attention is compared with the Eckart–Young prediction
   max(r* − r, 0)/r* for a flat spectrum (the n → ∞ limit, where y_i → W_Vᵀ Kᵀ x_i). The plateau
   rank is the smallest r with relative excess ≤ ``plateau_tol``.
2. **Recovery.** A full-rank student (r = d) from the same small initialisation, trained for
   ``recovery_steps``; the spectrum of the learned K̂ goes through every estimator (the
   largest-gap rank counted above σ₁/d), and its singular values are logged during training
   (incremental learning). It is kept apart from part 1 (its own cells, type "recovery"): its
   longer training never enters the deficiency curve or the plateau rank.
3. **Data-only frontier** (no training, no W_V): ``capacity.pooled_regression`` on linear QK
   data against n, and ``capacity.first_order_softmax`` on softmax data against n and β, for
   K* = U Vᵀ and the PSD K* = U Uᵀ (self-attention bias). Reported: every estimator on the
   coefficient's spectrum (gap above max(standard error, σ₁/n), the rule of ``rattn rank``),
   and σ_{r*+1}/σ_{r*}; for linear QK also its population value from
   ``capacity.pooled_population`` (W_Vᵀ[Kᵀ + (K + tr(K)I)/n], EB-7: the tail falls like 1/n).
   The number of sequences is ``max(min_sequences, tokens // n)``; the gap floor is
   ``capacity.attention_gap_floor``.

The experiment runs on CPU only (``--device`` other than cpu is refused): its students are at
most 16×16 matrices and its estimators run in NumPy. ``run`` is
``attention_students.run_experiment``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from reference import capacity
from torch_port.experiments import attention_students as st
from torch_port.experiments.common import RunOptions, figure, markdown_table

NAME = "native-rank"
KINDS = ("linear", "softmax")
#: Kernel shapes of the frontier: name -> psd flag of ``capacity.planted_kernel``.
SHAPES = {"UV^T": False, "UU^T": True}

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        n=8,
        d=8,
        r_star=2,
        noise=0.01,
        beta=2.0,
        train_sequences=100,
        test_sequences=100,
        ranks=[1, 2, 3],
        steps=120,
        recovery_steps=150,
        lr=2e-2,
        init_std=0.05,
        plateau_tol=0.02,
        dtype="float32",
        threads=1,
        log_every=10,
        frontier_n_linear=[8, 32],
        frontier_n_softmax=[8],
        frontier_betas=[0.5, 4.0],
        tokens=4000,
        min_sequences=20,
        seeds=[0],
    ),
    "quick": dict(
        n=16,
        d=16,
        r_star=3,
        noise=0.01,
        beta=2.0,
        train_sequences=400,
        test_sequences=500,
        ranks=[1, 2, 3, 4, 6],
        steps=1000,
        recovery_steps=1500,
        lr=2e-2,
        init_std=0.05,
        plateau_tol=0.02,
        dtype="float32",
        threads=1,
        log_every=25,
        frontier_n_linear=[16, 64, 256],
        frontier_n_softmax=[16, 64],
        frontier_betas=[0.5, 2.0, 8.0],
        tokens=65536,
        min_sequences=100,
        seeds=[0, 1, 2],
    ),
    "paper": dict(
        n=16,
        d=16,
        r_star=3,
        noise=0.01,
        beta=2.0,
        train_sequences=1000,
        test_sequences=1000,
        ranks=[1, 2, 3, 4, 6, 8],
        steps=3000,
        recovery_steps=4000,
        lr=1e-2,
        init_std=0.05,
        plateau_tol=0.02,
        dtype="float64",
        threads=1,
        log_every=25,
        frontier_n_linear=[16, 64, 256, 1024],
        frontier_n_softmax=[16, 64, 256],
        frontier_betas=[0.5, 2.0, 4.0, 8.0, 16.0],
        tokens=131072,
        min_sequences=100,
        seeds=list(range(10)),
    ),
}


def check_config(config: Mapping[str, Any]) -> None:
    """Refuse a configuration that cannot run, naming the offending value."""
    n, d, r = config["n"], config["d"], config["r_star"]
    if n < 2 or d < 2:
        raise ValueError(f"needs n ≥ 2 and d ≥ 2, got n = {n}, d = {d}")
    if not 1 <= r < d:
        raise ValueError(f"r_star must be in 1…d − 1 = {d - 1}, got {r}")
    bad = [k for k in config["ranks"] if not 1 <= k <= d]
    if bad or not config["ranks"]:
        raise ValueError(f"student ranks must be in 1…d = {d}, got {config['ranks']}")
    for key in ("train_sequences", "test_sequences", "steps", "recovery_steps", "log_every"):
        if config[key] < 1:
            raise ValueError(f"{key} must be ≥ 1, got {config[key]}")
    st.check_training(config, ("lr", "init_std", "plateau_tol", "beta"))
    for key in ("frontier_n_linear", "frontier_n_softmax"):
        if any(m < 2 for m in config[key]):
            raise ValueError(f"{key} must hold sequence lengths ≥ 2, got {config[key]}")
    if any(not (math.isfinite(b) and b > 0) for b in config["frontier_betas"]):
        raise ValueError(f"frontier_betas must be finite and > 0, got {config['frontier_betas']}")
    if config["min_sequences"] <= d:
        raise ValueError(
            f"min_sequences must exceed d = {d} (first-order estimator), "
            f"got {config['min_sequences']}"
        )


# ---------------------------------------------------------------------------------------------
# Students
# ---------------------------------------------------------------------------------------------
def teacher(config: Mapping[str, Any], kind: str, seed: int) -> dict[str, np.ndarray]:
    """Train and test sequences of the planted ``kind`` task (one K*, W_V* per seed and kind):
    ``x``, ``y`` (noisy) and ``clean`` (noiseless) outputs, the ``kernel`` K* and ``value`` W_V*.

    ``clean`` is the generator's own output drawn again with σ = 0 from the same seed (the same
    draws, so the same X, K*, W_V*, and y − clean is exactly its noise): ``PlantedTask`` does not
    keep the noiseless output, and this way its formula is not restated here."""
    total = config["train_sequences"] + config["test_sequences"]
    args = (total, config["n"], config["d"], config["d"], config["r_star"])
    extra = {} if kind == "linear" else {"beta": config["beta"]}
    make = capacity.linear_qk_task if kind == "linear" else capacity.softmax_task
    task = make(*args, seed=(seed, KINDS.index(kind)), noise=config["noise"], **extra)
    clean = make(*args, seed=(seed, KINDS.index(kind)), noise=0.0, **extra).y
    return {"x": task.x, "y": task.y, "clean": clean, "kernel": task.kernel, "value": task.value}


def student_cell(
    config: Mapping[str, Any], kind: str, rank: int, seed: int, *, recovery: bool = False
) -> dict[str, Any]:
    """Train a rank-``rank`` QK student of ``kind`` for ``steps`` (a ``recovery`` student: for
    ``recovery_steps``, logging its singular values every ``log_every`` steps); risks on the test
    sequences, the learned K̂'s spectrum and estimators."""
    dtype = st.dtype_of(config["dtype"])
    data = teacher(config, kind, seed)
    m, d = config["train_sequences"], config["d"]
    gen = st.student_generator(seed, rank, KINDS.index(kind))
    model = st.QKStudent(kind, d, rank, d, config["beta"], config["init_std"], gen, dtype)
    history: list[tuple[int, list[float]]] = []

    def log(step: int) -> None:
        s = np.linalg.svd(model.kernel().detach().double().numpy(), compute_uv=False)
        history.append((step, s[: min(d, 2 * config["r_star"] + 2)].tolist()))

    curve = st.train(
        model,
        st.as_tensor(data["x"][:m], dtype),
        st.as_tensor(data["y"][:m], dtype),
        steps=config["recovery_steps"] if recovery else config["steps"],
        lr=config["lr"],
        log_every=config["log_every"],
        on_log=log if recovery else None,
    )
    risks = st.relative_risks(
        model,
        st.as_tensor(data["x"][m:], dtype),
        st.as_tensor(data["y"][m:], dtype),
        st.as_tensor(data["clean"][m:], dtype),
    )
    s = np.linalg.svd(model.kernel().detach().double().numpy(), compute_uv=False)
    return {
        "type": "recovery" if recovery else "student",
        "kind": kind,
        "rank": rank,
        "seed": seed,
        **risks,
        "kernel_spectrum": s,
        "estimators": st.estimators(s, floor=float(s[0]) / d),
        "curve": curve,
        "spectrum_history": history,
    }


def recovery_cell(config: Mapping[str, Any], kind: str, seed: int) -> dict[str, Any]:
    """The full-rank (r = d) student of part 2, trained for ``recovery_steps``."""
    return student_cell(config, kind, config["d"], seed, recovery=True)


# ---------------------------------------------------------------------------------------------
# Data-only frontier
# ---------------------------------------------------------------------------------------------
def frontier_cell(
    config: Mapping[str, Any], kind: str, n: int, beta: float | None, shape: str, seed: int
) -> dict[str, Any]:
    """One data-only estimate: the coefficient of ``pooled_regression`` (linear) or of
    ``first_order_softmax`` (softmax), its spectrum, estimators and σ_{r*+1}/σ_{r*}."""
    d, r = config["d"], config["r_star"]
    sequences = max(config["min_sequences"], config["tokens"] // n)
    psd = SHAPES[shape]
    seq = (seed, KINDS.index(kind), n, int(psd), round(1000 * (beta or 0.0)))
    record: dict[str, Any] = {"type": "frontier", "kind": kind, "n": n, "beta": beta}
    record |= {"shape": shape, "seed": seed, "sequences": sequences}
    if kind == "linear":
        task = capacity.linear_qk_task(
            sequences, n, d, d, r, seed=seq, noise=config["noise"], psd=psd
        )
        reg = capacity.pooled_regression(task.x, task.y)
        pop = capacity.singular_values(capacity.pooled_population(task.kernel, task.value, n))
        record["population_ratio"] = float(pop[r] / pop[r - 1])
    else:
        task = capacity.softmax_task(
            sequences, n, d, d, r, beta=beta, seed=seq, noise=config["noise"], psd=psd
        )
        reg = capacity.first_order_softmax(task.x, task.y)
    s = capacity.singular_values(reg.coef)
    floor = capacity.attention_gap_floor(s, reg.stderr, n)
    record |= {
        "spectrum": s,
        "stderr": reg.stderr,
        "floor": floor,
        "estimators": st.estimators(s, floor=floor),
        "ratio": float(s[r] / s[r - 1]),
    }
    return record


def cells_of(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every unit of work in a fixed order: per seed the students (each kind: each rank, then
    the r = d recovery student), then the frontier cells."""
    cells: list[dict[str, Any]] = []
    ranks = sorted(set(config["ranks"]))
    for seed in config["seeds"]:
        for kind in KINDS:
            for rank in ranks:
                cells.append({"type": "student", "kind": kind, "rank": rank, "seed": seed})
            cells.append({"type": "recovery", "kind": kind, "seed": seed})
        for shape in SHAPES:
            for n in config["frontier_n_linear"]:
                cells.append(dict(type="frontier", kind="linear", n=n, beta=None, shape=shape))
                cells[-1]["seed"] = seed
            for n in config["frontier_n_softmax"]:
                for beta in config["frontier_betas"]:
                    cells.append(dict(type="frontier", kind="softmax", n=n, beta=beta, shape=shape))
                    cells[-1]["seed"] = seed
    return cells


def work(config: Mapping[str, Any]) -> Any:
    """The function computing one cell of ``cells_of(config)``."""
    handlers = {"student": student_cell, "recovery": recovery_cell, "frontier": frontier_cell}
    return st.cell_worker(config, handlers)


# ---------------------------------------------------------------------------------------------
# Summary, tables, plots
# ---------------------------------------------------------------------------------------------
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


def markdown(config: Mapping[str, Any], summary: Mapping[str, Any], seconds: float) -> str:
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
        "Linear: pooled regression; softmax: first-order estimator. Gap above max(SE, σ₁/n). "
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
    out.append(f"\nWall time {seconds:.1f} s.")
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
            axes[0].loglog(
                ns,
                [x["ratio"]["mean"] for x in lin],
                marker="o",
                color=f"C{j}",
                label=f"K* = {shape}, measured",
            )
            axes[0].loglog(
                ns,
                [x["population_ratio"]["mean"] for x in lin],
                ls="--",
                color=f"C{j}",
                label=f"K* = {shape}, population",
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


def run(options: RunOptions) -> dict[str, Any]:
    """Run the three parts for the preset's seeds; write results.json, results.md and plots.
    CPU only: any other ``options.device`` is refused before any work."""
    return st.run_experiment(
        NAME,
        options,
        PRESETS,
        check=check_config,
        cells=cells_of,
        work=work,
        summarize=summarize,
        plots=plots,
        markdown=markdown,
    )


def format_summary(document: Mapping[str, Any]) -> str:
    """Plateau ranks, recovered ranks and the frontier's recovery counts."""
    s = document["summary"]
    r = s["r_star"]
    lines = [f"native-rank: planted QK rank r* = {r}"]
    for kind, dfc in s["deficiency"].items():
        ex = ", ".join(
            f"r={k}: {e['mean']:.3g}" for k, e in zip(dfc["ranks"], dfc["excess"], strict=True)
        )
        lines.append(f"  {kind:<8} rel. excess {ex}; plateau at r = {dfc['plateau_rank']}")
    for kind, rec in s["recovery"].items():
        e = rec["estimators"]
        lines.append(
            f"  {kind:<8} full-rank student: r_0.9 {e['r_0.9']['mean']:.2f}, r_0.99 "
            f"{e['r_0.99']['mean']:.2f}, gap {e['gap']['mean']:.2f}, erank_E "
            f"{e['erank_E']['mean']:.3f}"
        )
    for row in s["frontier"]:
        beta = "" if row["beta"] is None else f", β = {row['beta']:g}"
        hits = row["recovered_seeds"]
        lines.append(
            f"  frontier {row['kind']:<7} {row['shape']} n = {row['n']}{beta}: gap = r* in "
            f"{hits['gap']}/{row['seeds']}, r_0.99 = r* in {hits['r_0.99']}/{row['seeds']}, "
            f"σ_(r*+1)/σ_r* = {row['ratio']['mean']:.3g}"
        )
    lines.append(f"  wall {s['wall_seconds']:.1f} s, cpu {s['cpu_seconds']:.1f} s")
    return "\n".join(lines)


__all__ = ["PRESETS", "format_summary", "run"]
