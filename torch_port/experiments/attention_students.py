"""Students and helpers shared by the Entropic-Bound experiments ``ladder`` and ``native-rank``.

Notation of ``reference.capacity``: a sequence X ∈ ℝ^{n×d} (rows are tokens), the output
Y = A·X·W_V ∈ ℝ^{n×d_v} with a token-mixing operator A ∈ ℝ^{n×n}. Students:

- ``StaticStudent``: an input-independent mixer, Y = A X with A = U Vᵀ (``"linear"``, rank ≤ r)
  or A = rowsoftmax(P Qᵀ) (``"softmax"``, logits of rank ≤ r); U, V, P, Q ∈ ℝ^{n×r}.
- ``QKStudent``: attention with a QK kernel K = W_Q W_Kᵀ of rank ≤ r (W_Q, W_K ∈ ℝ^{d×r}) and a
  learned value map W_V ∈ ℝ^{d×d_v}: A(X) = X K Xᵀ / n (``"linear"``) or
  rowsoftmax(β X K Xᵀ / √d) (``"softmax"``, β known to the student).

The factors start with iid N(0, ``init_std``²) entries (the standard deviation of an entry;
``capacity.small_init``'s ``init`` is a column norm instead, hence the different name).

Every student is trained full batch with ``torch.optim.Adam`` (``train``) in the dtype of its
data (float32 or float64, ``dtype_of``), from an initialisation drawn from a torch generator
(``student_generator``), so a run is a deterministic function of its seed. Cells of a sweep run
through ``runs.run_cells``, which saves every finished cell: an interrupted run resumes where it
stopped and gives the same results as an uninterrupted one. ``run_experiment`` is the whole
``run`` of both experiments (configuration, CPU-only check, one-thread cells, summary, plots,
results document); each experiment supplies its cells, their work, its summary and its reports
as a ``StudentExperiment``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from reference import capacity
from torch_port.experiments import runs
from torch_port.experiments.common import (
    RunOptions,
    configure,
    generator,
    jsonable,
    output_dir,
    results_document,
)

Tensor = torch.Tensor
DTYPES = {"float32": torch.float32, "float64": torch.float64}

#: The estimators reported for every spectrum, in table order (short name -> estimate_all key).
ESTIMATORS: dict[str, str] = {
    "num_rank(1e-3)": "numerical_rank(tau=0.001)",
    "num_rank(1e-2)": "numerical_rank(tau=0.01)",
    "r_0.9": "energy_threshold_rank(eta=0.9)",
    "r_0.99": "energy_threshold_rank(eta=0.99)",
    "gap": "largest_gap_rank",
    "erank_E": "energy_effective_rank",
    "erank_RV": "roy_vetterli_rank",
    "stable": "stable_rank",
}


def estimators(s: Sequence[float] | np.ndarray, floor: float = 0.0) -> dict[str, float]:
    """``capacity.estimate_all`` (τ = 1e-3) under the short names of ``ESTIMATORS``; the
    largest-gap rank uses ``floor`` (a noise level below which no gap is counted)."""
    raw = capacity.estimate_all(np.asarray(s, dtype=np.float64), tau=1e-3, floor=floor)
    return {short: float(raw[key]) for short, key in ESTIMATORS.items()}


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, minimum and maximum of per-seed values (the spread reported in the tables)."""
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), "min": float(a.min()), "max": float(a.max())}


def cell_text(stats: Mapping[str, float], digits: int = 3, integer: bool = False) -> str:
    """ "mean (min–max)" or just the value when the seeds agree; integers without decimals."""
    fmt = (lambda v: f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}") if integer else None
    fmt = fmt or (lambda v: f"{v:.{digits}g}")
    if stats["min"] == stats["max"]:
        return fmt(stats["mean"])
    mean = f"{stats['mean']:.2f}" if integer else fmt(stats["mean"])
    return f"{mean} ({fmt(stats['min'])}–{fmt(stats['max'])})"


def knee_rank(ranks: Sequence[int], excess: Sequence[float], tol: float) -> int | None:
    """The smallest student rank whose relative excess risk is ≤ ``tol`` (the start of the
    plateau at the noise floor), or None when no rank reaches it."""
    for r, e in sorted(zip(ranks, excess, strict=True)):
        if e <= tol:
            return int(r)
    return None


def plateau_ranks(
    cells: Sequence[Mapping[str, Any]], seeds: Sequence[int], tol: float
) -> list[int | None]:
    """``knee_rank`` of each seed's student cells (records with "seed", "rank", "excess")."""
    knees = []
    for seed in seeds:
        mine = [c for c in cells if c["seed"] == seed]
        knees.append(knee_rank([c["rank"] for c in mine], [c["excess"] for c in mine], tol))
    return knees


def check_training(config: Mapping[str, Any], positive: Sequence[str]) -> None:
    """The checks every student sweep shares: ``positive`` keys finite and > 0, ``noise`` finite
    and ≥ 0, a known ``dtype`` and ``threads`` a positive integer."""
    for key in positive:
        if not (math.isfinite(config[key]) and config[key] > 0):
            raise ValueError(f"{key} must be finite and > 0, got {config[key]}")
    if not (math.isfinite(config["noise"]) and config["noise"] >= 0):
        raise ValueError(f"noise must be finite and ≥ 0, got {config['noise']}")
    dtype_of(config["dtype"])
    threads = config["threads"]
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be ≥ 1, got {threads}")


# ---------------------------------------------------------------------------------------------
# Students
# ---------------------------------------------------------------------------------------------
def dtype_of(name: str) -> torch.dtype:
    """``torch.float32`` or ``torch.float64`` by name; anything else is refused."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def student_generator(seed: int, rank: int, salt: int) -> torch.Generator:
    """The initialisation generator of the student of ``rank`` for ``seed``; ``salt`` tells
    apart students of the same rank (e.g. the attention kind)."""
    return generator(1_000_003 * seed + 1_009 * rank + salt)


def _check_kind(kind: str) -> str:
    if kind not in ("linear", "softmax"):
        raise ValueError(f"kind must be 'linear' or 'softmax', got {kind!r}")
    return kind


def _normal(
    shape: tuple[int, ...], std: float, gen: torch.Generator, dtype: torch.dtype
) -> nn.Parameter:
    """iid N(0, std²) entries drawn in float64 from ``gen`` (the same numbers in either dtype)."""
    return nn.Parameter((torch.randn(shape, generator=gen, dtype=torch.float64) * std).to(dtype))


class StaticStudent(nn.Module):
    """Y = A X with an input-independent A: U Vᵀ (``kind="linear"``) or rowsoftmax(P Qᵀ)
    (``kind="softmax"``), factors in ℝ^{n×r} with iid N(0, init_std²) entries."""

    def __init__(
        self,
        kind: str,
        n: int,
        r: int,
        init_std: float,
        gen: torch.Generator,
        dtype: torch.dtype = torch.float64,
    ):
        super().__init__()
        self.kind = _check_kind(kind)
        self.left = _normal((n, r), init_std, gen, dtype)
        self.right = _normal((n, r), init_std, gen, dtype)

    def mixer(self) -> Tensor:
        """The n×n mixing matrix A."""
        prod = self.left @ self.right.T
        return prod if self.kind == "linear" else torch.softmax(prod, dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        return self.mixer() @ x


class QKStudent(nn.Module):
    """Attention with K = W_Q W_Kᵀ of rank ≤ r and a learned W_V: Y = A(X) X W_V, with
    A(X) = X K Xᵀ / n (linear) or rowsoftmax(β X K Xᵀ / √d) (softmax). W_Q, W_K have iid
    N(0, init_std²) entries (small initialisation: K is of order init_std²·√r); W_V has iid
    N(0, 1/d) entries."""

    def __init__(
        self,
        kind: str,
        d: int,
        r: int,
        dv: int,
        beta: float,
        init_std: float,
        gen: torch.Generator,
        dtype: torch.dtype = torch.float64,
    ):
        super().__init__()
        self.kind, self.beta = _check_kind(kind), float(beta)
        self.w_q = _normal((d, r), init_std, gen, dtype)
        self.w_k = _normal((d, r), init_std, gen, dtype)
        self.w_v = _normal((d, dv), 1.0 / math.sqrt(d), gen, dtype)

    def kernel(self) -> Tensor:
        """The QK kernel K = W_Q W_Kᵀ ∈ ℝ^{d×d}."""
        return self.w_q @ self.w_k.T

    def forward(self, x: Tensor) -> Tensor:
        n, d = x.shape[-2], x.shape[-1]
        logits = (x @ self.w_q) @ (x @ self.w_k).transpose(-1, -2)
        if self.kind == "linear":
            mix = logits / n
        else:
            mix = torch.softmax(self.beta * logits / math.sqrt(d), dim=-1)
        return mix @ (x @ self.w_v)


# ---------------------------------------------------------------------------------------------
# Training and evaluation
# ---------------------------------------------------------------------------------------------
def as_tensor(a: np.ndarray, dtype: torch.dtype = torch.float64) -> Tensor:
    """A CPU tensor of a NumPy array (the data are generated in float64 and cast once)."""
    return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float64).to(dtype)


def train(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    steps: int,
    lr: float,
    log_every: int = 100,
    on_log: Callable[[int], None] | None = None,
) -> list[tuple[int, float]]:
    """Full-batch Adam on the mean squared error ‖model(x) − y‖²/numel for ``steps`` steps.

    Returns the training curve [(t, loss after t updates)] for t = 0, ``log_every``,
    2·``log_every``, … and t = ``steps`` (the final loss, measured after the last update), and
    calls ``on_log(t)`` at the same t. A non-finite loss is an error naming the step."""

    def diverged(loss: Tensor, step: int) -> ValueError:
        return ValueError(f"training diverged at step {step} (loss {loss.item()}); lower lr={lr}")

    opt = torch.optim.Adam(model.parameters(), lr=lr)
    curve: list[tuple[int, float]] = []
    if on_log is not None:
        on_log(0)
    for done in range(steps):  # `done` updates so far
        opt.zero_grad(set_to_none=True)
        loss = torch.mean(torch.square(model(x) - y))
        if not torch.isfinite(loss):
            raise diverged(loss, done + 1)
        if done % log_every == 0:
            curve.append((done, float(loss.detach())))
        loss.backward()
        opt.step()
        if on_log is not None and ((done + 1) % log_every == 0 or done + 1 == steps):
            on_log(done + 1)
    with torch.no_grad():
        final = torch.mean(torch.square(model(x) - y))
    if not torch.isfinite(final):
        raise diverged(final, steps)
    curve.append((steps, float(final)))
    return curve


def relative_risks(model: nn.Module, x: Tensor, y: Tensor, clean: Tensor) -> dict[str, float]:
    """On held-out sequences: ``excess`` = ‖ŷ − y_clean‖²/‖y_clean‖² (relative excess risk over
    the Bayes predictor), ``mse`` = ‖ŷ − y‖²/‖y_clean‖² (relative test MSE) and ``floor`` =
    ‖y − y_clean‖²/‖y_clean‖² (the relative noise floor: the Bayes predictor's relative MSE)."""
    with torch.no_grad():
        pred = model(x)
        power = float(torch.sum(torch.square(clean)))
        return {
            "excess": float(torch.sum(torch.square(pred - clean))) / power,
            "mse": float(torch.sum(torch.square(pred - y))) / power,
            "floor": float(torch.sum(torch.square(y - clean))) / power,
        }


def cell_worker(
    config: Mapping[str, Any], handlers: Mapping[str, Callable[..., dict[str, Any]]]
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """The function computing one cell: ``handlers[cell["type"]](config, **other fields)``."""

    def one(cell: Mapping[str, Any]) -> dict[str, Any]:
        fields = {k: v for k, v in cell.items() if k != "type"}
        return handlers[cell["type"]](config, **fields)

    return one


def cpu_only(name: str, device: str) -> None:
    """Refuse any device but the CPU: the students are n×n or d×d matrices with n, d ≤ 16 (a
    kernel launch costs more than the work), and the estimators run in NumPy."""
    if device != "cpu":
        raise ValueError(
            f"{name} runs on CPU only: its students are matrices of at most 16×16, where a GPU "
            f"only adds launch overhead; got --device {device!r}, use --device cpu"
        )


@dataclass(frozen=True)
class StudentExperiment:
    """What a student-sweep experiment module (``ladder``, ``native_rank``) supplies to
    ``run_experiment``: its ``name`` and ``presets``; ``check(config)`` (raises on a configuration
    that cannot run); ``cells(config)``, the list of cells (JSON-able dicts); ``work(config)``,
    the function computing one cell's record; ``summarize(config, runs)``;
    ``plots(directory, config, summary, runs)``, the file names drawn; and
    ``markdown(config, summary)``, results.md (no timings: a rerun writes it again exactly)."""

    name: str
    presets: Mapping[str, Mapping[str, Any]]
    check: Callable[[Mapping[str, Any]], None]
    cells: Callable[[Mapping[str, Any]], list[dict[str, Any]]]
    work: Callable[[Mapping[str, Any]], Callable[[Mapping[str, Any]], dict[str, Any]]]
    summarize: Callable[[Mapping[str, Any], list[dict[str, Any]]], dict[str, Any]]
    plots: Callable[..., list[str]]
    markdown: Callable[[Mapping[str, Any], Mapping[str, Any], float], str]


def run_experiment(experiment: StudentExperiment, options: RunOptions) -> dict[str, Any]:
    """The ``run`` of a student sweep: configure and ``check`` (and ``cpu_only``) before any
    work, the ``cells`` through ``runs.run_cells`` (each keyed by the configuration and the
    cell) with ``work(config)`` under the preset's ``threads``, then ``summarize(config, runs)``
    (with wall and CPU seconds), ``plots(directory, config, summary, runs)`` (file names) and
    results.json/results.md (``runs.finish``). The results document is built inside the thread
    context, so its environment records the thread count used."""
    name = experiment.name
    config = configure(experiment.presets, options)
    experiment.check(config)
    cpu_only(name, options.device)
    directory = output_dir(options, name)
    start, cpu = time.perf_counter(), time.process_time()
    with runs.torch_threads(config["threads"]):
        compute = experiment.work(config)
        specs = [
            runs.Cell(config, json.dumps(jsonable(cell), sort_keys=True), cell)
            for cell in experiment.cells(config)
        ]
        records = runs.run_cells(
            directory,
            specs,
            lambda cell, checkpoint, bar: compute(cell.spec),
            resume=options.resume,
            desc=name,
            show=options.progress,
        )
        summary = experiment.summarize(config, records)
        summary["wall_seconds"] = time.perf_counter() - start
        summary["cpu_seconds"] = time.process_time() - cpu
        summary["plots"] = experiment.plots(directory, config, summary, records)
        document = results_document(name, options, config, records, summary, "cpu")
    markdown = experiment.markdown(config, summary)
    return runs.finish(directory, specs, document, markdown)
