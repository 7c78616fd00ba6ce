"""The cells of the attention-native rank experiment (``native_rank``): one trained student or
one data-only estimate each, a deterministic function of its fields.

``teacher`` draws the planted task of a seed and kind; ``student_cell`` trains a rank-r
``attention_students.QKStudent`` on it (part 1, deficiency and achievability), ``recovery_cell``
the full-rank student of part 2, and ``frontier_cell`` computes one data-only estimate of part 3
(``capacity.pooled_regression`` for linear QK, ``capacity.first_order_softmax`` for softmax).
``cells_of`` lists every cell of a configuration in the order they run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from reference import capacity
from torch_port.experiments import attention_students as st

#: Attention kinds of the teachers and students, in order (the index salts the seeds).
KINDS = ("linear", "softmax")
#: Kernel shapes of the frontier: name -> psd flag of ``capacity.planted_kernel``.
SHAPES = {"UV^T": False, "UU^T": True}


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
    edge = capacity.noise_edge(reg)
    floor = capacity.attention_gap_floor(s, edge, n)
    record |= {
        "spectrum": s,
        "stderr": reg.stderr,
        "noise_edge": edge,
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
