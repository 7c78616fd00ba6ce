"""The interpolation ladder (Entropic Bound, background §4): where does a static rank fail?

Every rung plants a mixing operator of rank r* in sequences X ∈ ℝ^{n×d} with iid N(0, 1) tokens
and W_V = I: Y = A·X + σE. A naive transfer of the static rank to attention summarises the data
by a static n×n mixer and reads its rank. Rungs (the tokens are exchangeable on R3 and R4):

- **R0 static linear**: A = A* = U Vᵀ (``capacity.planted_mixer``, rank r*).
- **R1 static softmax**: A = rowsoftmax(L*), L* = β_s·√n·U Vᵀ (positional logits of rank r*; the
  softmax attention of one-hot position tokens, ``positional_softmax``); A is full rank. The
  static summary is read raw and after **logit inversion** L̂ = log Â centred by rows
  (log A·J = L*J, J = I − 11ᵀ/n, of rank ≤ r*).
- **R2 rank-constrained students** on the R0 and R1 data: Y ≈ U Vᵀ X and Y ≈ rowsoftmax(P Qᵀ) X
  with U, V, P, Q ∈ ℝ^{n×r}, trained with Adam; the rank read off is the start of the plateau of
  the test risk (the smallest r with relative excess ≤ ``plateau_tol``).
- **R3 input-conditioned linear**: A(X) = X K Xᵀ/n with K = ``capacity.planted_kernel`` (rank r*).
- **R4 input-conditioned softmax**: A(X) = rowsoftmax(β X K Xᵀ/√d) (also read after logit
  inversion).

The static summary is the least-squares static mixer Â = (ΣYXᵀ)(ΣXXᵀ)⁻¹
(``capacity.ols_static_mixer``, fitted on all but the ``test_sequences`` held-out sequences).
Its spectrum goes through every estimator of ``capacity.estimate_all`` (numerical rank at
τ = 1e-3 and 1e-2, r_0.9, r_0.99, erank_E, erank_RV, stable rank, and the largest-gap rank counted
only above σ₁/n). Verdict per seed: the rank is recovered when r_0.9 = r_0.99 = gap = r* (R2:
when the plateau starts at r*). Also reported: the relative test excess of the static mixer,
‖ÂX − AX‖²/‖AX‖² on held-out sequences, i.e. how much of the output any static kernel explains.
Expected (exchangeability lemma EB-5: under R3 and R4 the static mixer tends to aI + b11ᵀ, of
rank 0, 1, n − 1 or n): recovered on R0–R2, not on R3–R4.

The ladder runs on CPU only (``--device`` other than cpu is refused): its students are at most
16×16 matrices and its estimators run in NumPy. ``run`` is ``attention_students.run_experiment``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from reference import capacity
from torch_port.experiments import attention_students as st
from torch_port.experiments.common import RunOptions, figure, markdown_table, preset_variant

NAME = "ladder"

#: Rung id -> (label, kind of planted operator).
RUNGS: dict[str, str] = {
    "R0": "static linear",
    "R1": "static softmax",
    "R3": "input-conditioned linear",
    "R4": "input-conditioned softmax",
}
#: Rows of the summary table: (row id, rung, read after logit inversion).
READINGS = [
    ("R0", "R0", False),
    ("R1 raw", "R1", False),
    ("R1 logit inversion", "R1", True),
    ("R3", "R3", False),
    ("R4 raw", "R4", False),
    ("R4 logit inversion", "R4", True),
]
#: R2 students: kind -> the rung whose data they fit.
STUDENTS = {"linear": "R0", "softmax": "R1"}

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        n=8,
        d=8,
        r_star=2,
        spec="flat",
        sequences=300,
        test_sequences=100,
        noise=0.01,
        beta=2.0,
        beta_static=2.0,
        student_ranks=[1, 2, 3],
        student_sequences=100,
        steps=150,
        lr=2e-2,
        init_std=0.1,
        plateau_tol=0.02,
        dtype="float32",
        threads=1,
        seeds=[0],
    ),
}
# CPU minutes: n = d = 16 and r* = 3, more sequences, longer student training.
PRESETS["quick"] = preset_variant(
    PRESETS["smoke"],
    n=16,
    d=16,
    r_star=3,
    sequences=4000,
    test_sequences=500,
    student_ranks=[1, 2, 3, 4, 5, 6],
    student_sequences=400,
    steps=1000,
    seeds=[0, 1, 2],
)
# The quick problem with 5× the sequences, 3× the steps, in float64, over 10 seeds.
PRESETS["paper"] = preset_variant(
    PRESETS["quick"],
    sequences=20000,
    test_sequences=2000,
    student_ranks=[1, 2, 3, 4, 5, 6, 8],
    student_sequences=2000,
    steps=3000,
    lr=1e-2,
    dtype="float64",
    seeds=list(range(10)),
)


def check_config(config: Mapping[str, Any]) -> None:
    """Refuse a configuration that cannot run, naming the offending value."""
    n, d, r = config["n"], config["d"], config["r_star"]
    if not (2 <= n and 1 <= d):
        raise ValueError(f"needs n ≥ 2 and d ≥ 1, got n = {n}, d = {d}")
    if not 1 <= r <= min(n, d):
        raise ValueError(f"r_star must be in 1…min(n, d) = {min(n, d)}, got {r}")
    fit = config["sequences"] - config["test_sequences"]
    if config["test_sequences"] < 1 or fit * d < n:
        raise ValueError(
            f"the static mixer needs (sequences − test_sequences)·d ≥ n and a test set, got "
            f"sequences = {config['sequences']}, test_sequences = {config['test_sequences']}"
        )
    if not 1 <= config["student_sequences"] <= fit:
        raise ValueError(
            f"student_sequences must be in 1…{fit} (the non-test sequences), got "
            f"{config['student_sequences']}"
        )
    bad = [k for k in config["student_ranks"] if not 1 <= k <= n]
    if bad or not config["student_ranks"]:
        raise ValueError(f"student ranks must be in 1…n = {n}, got {config['student_ranks']}")
    if config["steps"] < 1:
        raise ValueError(f"steps must be ≥ 1, got {config['steps']}")
    st.check_training(config, ("lr", "init_std", "plateau_tol"))


# ---------------------------------------------------------------------------------------------
# Data and static summaries
# ---------------------------------------------------------------------------------------------
def positional_softmax(a: np.ndarray, beta_static: float) -> np.ndarray:
    """rowsoftmax(β_s·√n·A): ``capacity.softmax_attention_mixing`` of the one-hot position
    tokens X = I_n with kernel A and β = β_s·n (β X A Xᵀ/√n = β_s·√n·A), row maximum
    subtracted (exact, no overflow)."""
    n = a.shape[-1]
    return capacity.softmax_attention_mixing(np.eye(n), a, beta_static * n)


def rung_data(rung: str, config: Mapping[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Sequences of one rung: ``x`` (S, n, d), the noiseless output ``clean`` = A·X and ``y`` =
    clean + σE; the planted operator (``mixer`` A* or ``kernel`` K) for the record. Drawn from
    ``numpy.random.default_rng([seed, rung number])``."""
    n, d, r, spec = config["n"], config["d"], config["r_star"], config["spec"]
    rng = np.random.default_rng([seed, int(rung[1])])
    out: dict[str, np.ndarray] = {}
    if rung in ("R0", "R1"):
        a = capacity.planted_mixer(n, r, rng, spec)
        if rung == "R1":
            out["logits"] = config["beta_static"] * math.sqrt(n) * a
            a = positional_softmax(a, config["beta_static"])
        out["mixer"] = a
        x = rng.standard_normal((config["sequences"], n, d))
        clean = a @ x
    else:
        k = capacity.planted_kernel(d, r, rng, spec)
        out["kernel"] = k
        x = rng.standard_normal((config["sequences"], n, d))
        if rung == "R3":
            clean = capacity.linear_attention_mixing(x, k) @ x
        else:
            clean = capacity.softmax_attention_mixing(x, k, config["beta"]) @ x
    out.update(x=x, clean=clean, y=clean + config["noise"] * rng.standard_normal(clean.shape))
    return out


def logit_inversion(a_hat: np.ndarray, floor: float = 1e-12) -> tuple[np.ndarray, int]:
    """L̂ = log max(Â, floor) with its row means subtracted (softmax is invariant to row shifts:
    log rowsoftmax(L)·J = L·J), and the number of entries ≤ 0 that were clipped at ``floor``.

    The same step as inside ``capacity.inversion_estimator``, which does not expose it."""
    clipped = int(np.sum(a_hat <= 0))
    logs = np.log(np.maximum(a_hat, floor))
    return logs - logs.mean(axis=1, keepdims=True), clipped


def static_cell(config: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The static summaries of every rung for one seed: spectra, estimators and verdicts."""
    n, r, test = config["n"], config["r_star"], config["test_sequences"]
    readings: dict[str, Any] = {}
    for rung in RUNGS:
        data = rung_data(rung, config, seed)
        a_hat = capacity.ols_static_mixer(data["x"][:-test], data["y"][:-test])
        pred = a_hat @ data["x"][-test:]
        clean = data["clean"][-test:]
        excess = float(np.sum(np.square(pred - clean)) / np.sum(np.square(clean)))
        for row, of, invert in READINGS:
            if of != rung:
                continue
            op, clipped = logit_inversion(a_hat) if invert else (a_hat, 0)
            s = capacity.singular_values(op)
            est = st.estimators(s, floor=float(s[0]) / n)
            recovered = est["r_0.9"] == est["r_0.99"] == est["gap"] == r
            readings[row] = {
                "spectrum": s,
                "estimators": est,
                "recovered": bool(recovered),
                "static_excess": excess,
                "clipped_entries": clipped,
            }
    return {"type": "static", "seed": seed, "readings": readings}


# ---------------------------------------------------------------------------------------------
# R2: rank-constrained students
# ---------------------------------------------------------------------------------------------
def student_cell(config: Mapping[str, Any], kind: str, rank: int, seed: int) -> dict[str, Any]:
    """Train a rank-``rank`` static student of ``kind`` on the first ``student_sequences`` of the
    rung's data (``STUDENTS``) and evaluate it on the held-out sequences."""
    dtype = st.dtype_of(config["dtype"])
    data = rung_data(STUDENTS[kind], config, seed)
    m, test = config["student_sequences"], config["test_sequences"]
    gen = st.student_generator(seed, rank, int(kind == "softmax"))
    model = st.StaticStudent(kind, config["n"], rank, config["init_std"], gen, dtype)
    x, y = st.as_tensor(data["x"][:m], dtype), st.as_tensor(data["y"][:m], dtype)
    curve = st.train(model, x, y, steps=config["steps"], lr=config["lr"])
    risks = st.relative_risks(
        model,
        st.as_tensor(data["x"][-test:], dtype),
        st.as_tensor(data["y"][-test:], dtype),
        st.as_tensor(data["clean"][-test:], dtype),
    )
    return {"type": "student", "kind": kind, "rank": rank, "seed": seed, **risks, "curve": curve}


def cells_of(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every unit of work, in a fixed order: per seed the static summaries, then the students."""
    cells: list[dict[str, Any]] = []
    for seed in config["seeds"]:
        cells.append({"type": "static", "seed": seed})
        for kind in STUDENTS:
            for rank in config["student_ranks"]:
                cells.append({"type": "student", "kind": kind, "rank": rank, "seed": seed})
    return cells


def work(config: Mapping[str, Any]) -> Any:
    """The function computing one cell of ``cells_of(config)``."""
    return st.cell_worker(config, {"static": static_cell, "student": student_cell})


# ---------------------------------------------------------------------------------------------
# Summary, tables, plots
# ---------------------------------------------------------------------------------------------
def summarize(config: Mapping[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per reading: estimators (mean, min, max over seeds), recovered seeds and verdict; per
    student kind: relative excess and test MSE against rank, the plateau rank per seed."""
    r = config["r_star"]
    static = [c for c in runs if c["type"] == "static"]
    seeds = len(static)
    rows = []
    for row, rung, invert in READINGS:
        per = [c["readings"][row] for c in static]
        est = {k: st.spread([p["estimators"][k] for p in per]) for k in st.ESTIMATORS}
        hits = sum(p["recovered"] for p in per)
        rows.append(
            {
                "reading": row,
                "rung": rung,
                "operator": RUNGS[rung],
                "logit_inversion": invert,
                "estimators": est,
                "static_excess": st.spread([p["static_excess"] for p in per]),
                "recovered_seeds": hits,
                "verdict": verdict(hits, seeds),
                "spectrum_mean": np.mean([p["spectrum"] for p in per], axis=0),
            }
        )
    students: dict[str, Any] = {}
    for kind, rung in STUDENTS.items():
        cells = [c for c in runs if c["type"] == "student" and c["kind"] == kind]
        by_rank = {
            rank: [c for c in cells if c["rank"] == rank] for rank in config["student_ranks"]
        }
        knees = st.plateau_ranks(cells, config["seeds"], config["plateau_tol"])
        hits = sum(k == r for k in knees)
        students[kind] = {
            "data": rung,
            "ranks": list(by_rank),
            "excess": [st.spread([c["excess"] for c in cs]) for cs in by_rank.values()],
            "mse": [st.spread([c["mse"] for c in cs]) for cs in by_rank.values()],
            "floor": st.spread([c["floor"] for c in cells]),
            "plateau_rank": knees,
            "recovered_seeds": hits,
            "verdict": verdict(hits, seeds),
        }
    return {"r_star": r, "seeds": seeds, "readings": rows, "students": students}


def verdict(hits: int, seeds: int) -> str:
    """ "recovers r*" (every seed), "fails" (none) or "partial (k/m seeds)"."""
    if hits == seeds:
        return "recovers r*"
    return "fails" if hits == 0 else f"partial ({hits}/{seeds} seeds)"


def markdown(config: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """results.md: the ladder table and the R2 risk-against-rank table."""
    r, n = config["r_star"], config["n"]
    head = (
        f"# Interpolation ladder (r* = {r}, n = {n}, d = {config['d']}, W_V = I, "
        f"S = {config['sequences']}, σ = {config['noise']}, β = {config['beta']}, "
        f"β_s = {config['beta_static']}, seeds {config['seeds']})\n\n"
        "Static summary: least-squares static mixer Â; mean over seeds (min–max). Gap: "
        "largest-gap rank above σ₁/n. Static excess: ‖ÂX − AX‖²/‖AX‖² on held-out sequences.\n"
    )
    cols = ["num_rank(1e-3)", "num_rank(1e-2)", "r_0.9", "r_0.99", "gap", "erank_E", "erank_RV"]
    rows = []
    for row in summary["readings"]:
        e = row["estimators"]
        rows.append(
            [row["reading"], row["operator"]]
            + [st.cell_text(e[c], integer=c not in ("erank_E", "erank_RV")) for c in cols]
            + [st.cell_text(row["static_excess"], 2), row["verdict"]]
        )
    for kind, s in summary["students"].items():
        knees = ", ".join("none" if k is None else str(k) for k in s["plateau_rank"])
        rows.append(
            [f"R2 {kind} student", f"rank-r student on {s['data']} data"]
            + ["–"] * 4
            + [f"plateau at r = {knees}", "–", "–", "–", s["verdict"]]
        )
    table = markdown_table(["reading", "operator", *cols, "static excess", "verdict"], rows)
    srows = []
    for kind, s in summary["students"].items():
        for rank, ex, ms in zip(s["ranks"], s["excess"], s["mse"], strict=True):
            srows.append([kind, rank, st.cell_text(ex, 3), st.cell_text(ms, 3)])
        srows.append([kind, "noise floor", "0", st.cell_text(s["floor"], 3)])
    stable = markdown_table(["R2 student", "rank r", "relative excess", "relative test MSE"], srows)
    return (
        f"{head}\n{table}\n\n## R2: rank-constrained students (plateau: relative excess ≤ "
        f"{config['plateau_tol']})\n\n{stable}\n"
    )


def plots(
    directory: Any,
    config: Mapping[str, Any],
    summary: Mapping[str, Any],
    runs: list[dict[str, Any]],
) -> list[str]:
    """spectra.png (normalised mean spectrum of each reading) and students.png (R2 risk)."""
    r = config["r_star"]
    with figure(directory / "spectra.png") as axes:
        ax = axes[0]
        for row in summary["readings"]:
            s = np.asarray(row["spectrum_mean"])
            ax.semilogy(np.arange(1, s.size + 1), s / s[0], marker=".", label=row["reading"])
        ax.axvline(r, color="grey", ls=":", lw=1)
        ax.set(xlabel="index i", ylabel="σ_i / σ_1 (mean over seeds)", title="static summaries")
        ax.legend(fontsize=7)
    with figure(directory / "students.png") as axes:
        ax = axes[0]
        for kind, s in summary["students"].items():
            ranks = s["ranks"]
            ax.semilogy(ranks, [e["mean"] for e in s["excess"]], marker="o", label=f"{kind}")
            ax.fill_between(
                ranks, [e["min"] for e in s["excess"]], [e["max"] for e in s["excess"]], alpha=0.2
            )
        ax.axvline(r, color="grey", ls=":", lw=1)
        ax.set(xlabel="student rank r", ylabel="relative excess test risk", title="R2 students")
        ax.legend(fontsize=8)
    return ["spectra.png", "students.png"]


EXPERIMENT = st.StudentExperiment(
    NAME, PRESETS, check_config, cells_of, work, summarize, plots, markdown
)


def run(options: RunOptions) -> dict[str, Any]:
    """Run the ladder for the preset's seeds; write results.json, results.md and the plots.
    CPU only: any other ``options.device`` is refused before any work."""
    return st.run_experiment(EXPERIMENT, options)


def format_summary(document: Mapping[str, Any]) -> str:
    """One line per reading (r_0.9, r_0.99, gap, verdict) and one per R2 student kind."""
    s = document["summary"]
    lines = [f"ladder: planted r* = {s['r_star']}, {s['seeds']} seed(s)"]
    for row in s["readings"]:
        e = row["estimators"]
        lines.append(
            f"  {row['reading']:<20} r_0.9 {e['r_0.9']['mean']:5.2f}  r_0.99 "
            f"{e['r_0.99']['mean']:5.2f}  gap {e['gap']['mean']:5.2f}  → {row['verdict']}"
        )
    for kind, st_ in s["students"].items():
        lines.append(
            f"  R2 {kind:<8} student   plateau at r = {st_['plateau_rank']}  → {st_['verdict']}"
        )
    lines.append(f"  wall {s['wall_seconds']:.1f} s, cpu {s['cpu_seconds']:.1f} s")
    return "\n".join(lines)


__all__ = ["PRESETS", "format_summary", "run"]
