"""The seeded problem ``rattn conform`` drives an optimizer with, and the driver.

Points (``spaces``): on Stiefel, one St(8, 3) parameter and one batch of two St(6, 2) frames
(shape (2, 6, 2)); on one of the ten, one point of 6×5 matrices of rank 2 and a batch of two
points of 5×4 matrices of rank 2, each held by its factors. Start points are the reference
geometry's random points (Haar frames), so that both a single point and a batch, and two sizes,
are exercised. Gradients are known functions of the point: for each element, with W the matrix
it represents (a frame itself on Stiefel; each block group's stacked matrix for a block variant),

    G_t(W) = 2·A·(W − T)·N + B_t,

N = diag(n, …, 1), B_t a Gaussian matrix of step t (a time-varying term, so the moments see a
changing gradient), pulled back to the factors by the chain rule (``egrad_from_matrix``). On
Stiefel T = 0 and A is a symmetric matrix (the Brockett cost tr(WᵀAWN), bounded on the compact
manifold); on the ten, whose sets are unbounded (R1, R2) or whose factors are, A is symmetric
positive definite (MMᵀ/m + I) and T the matrix of a random point, so the cost pulls W to T and
the factors stay as well conditioned as T's. The rotated problem (A, T, B_t) → (QAQᵀ, QT, QB_t)
has G'(QW) = Q·G(W), which is what an O(m)-equivariance check needs (Q acts on the row
factor). Gradients are formed in float64 from the point the optimizer holds and rounded to its
dtype; the reference is given the same values.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import reference as ref
from proofs_checks.conformance.spaces import FrameSpace, space

Array = np.ndarray

DTYPES = {"float64": torch.float64, "float32": torch.float32}


class TargetError(ValueError):
    """The target cannot be used: its factory fails, or its optimizer misbehaves in a way no
    property can measure (raises on a plain step, returns no optimizer)."""


@dataclass(frozen=True)
class Problem:
    """The seeded gradient oracle on a space; ``rotated()`` is the same problem seen through Q."""

    seed: int = 0
    space: Any = field(default_factory=FrameSpace)
    a: tuple[Array, ...] = field(default=(), repr=False)
    target: tuple[list[Array], ...] | None = field(default=None, repr=False)
    #: Per point (Q, P): Q ∈ O(rows) acting on W's rows, P ∈ O(cols) on its columns (None on
    #: Stiefel, whose statement is left equivariance, RA-4).
    rotation: tuple[tuple[Array, Array | None], ...] | None = field(default=None, repr=False)

    @staticmethod
    def make(seed: int = 0, geometry: str = "stiefel", options: dict | None = None) -> Problem:
        sp = space(geometry, options)
        rng = np.random.default_rng([seed, 1])
        a = []
        for i in range(len(sp)):
            m = rng.standard_normal((sp.rows(i), sp.rows(i)))
            a.append((m + m.T) / 2.0 if sp.name == "stiefel" else m @ m.T / len(m) + np.eye(len(m)))
        if sp.name == "stiefel":
            return Problem(seed, sp, tuple(a))
        rng = np.random.default_rng([seed, 5])
        target = tuple(sp.matrices(i, sp.geometry(i).random_point(rng)) for i in range(len(sp)))
        return Problem(seed, sp, tuple(a), target)

    def start(self) -> list[Array]:
        """The parameters' arrays (float64) at random points, rotated when the problem is."""
        rng = np.random.default_rng([self.seed, 2])
        arrays: list[Array] = []
        for i in range(len(self.space)):
            geometry = self.space.geometry(i)
            xs = [geometry.random_point(rng) for _ in range(self.space.count(i))]
            arrays += self.space.assemble(i, [self._rotate(i, x) for x in xs])
        return arrays

    def _rotate(self, i: int, x: Any) -> Any:
        return x if self.rotation is None else self.space.rotate(self.rotation[i], x)

    def rotated(self, seed: int = 3) -> Problem:
        """The problem seen through Haar Q ∈ O(m) (and, on the ten, P ∈ O(n)) per point: start
        Q·W·Pᵀ, gradients Q·G·Pᵀ."""
        rng = np.random.default_rng([self.seed, seed])
        qs = []
        for i in range(len(self.space)):
            m = self.space.rows(i)
            q = ref.Stiefel(m, m).random_point(rng) * rng.choice([-1.0, 1.0])
            n = self.space.cols(i)
            p = None if self.space.name == "stiefel" else ref.Stiefel(n, n).random_point(rng)
            qs.append((q, p))
        return Problem(self.seed, self.space, self.a, self.target, tuple(qs))

    def point_arrays(self, arrays: Sequence[Array], i: int) -> list[Array]:
        return [arrays[k] for k in self.space.params_of(i)]

    def elements(self, arrays: Sequence[Array], i: int) -> list[Any]:
        """The reference points of point i of the parameters' arrays."""
        return self.space.elements(i, self.point_arrays(arrays, i))

    def _oracle(self, arrays: Sequence[Array], t: int, scale: float) -> list[list[tuple]]:
        """Per point, per element: (x, G_W of each block group, the factor gradient)."""
        out = []
        for i in range(len(self.space)):
            xs = self.elements(arrays, i)
            mats = [self.space.matrices(i, x) for x in xs]
            rows, cols = mats[0][0].shape
            rng = np.random.default_rng([self.seed, 4, t, i])
            b = rng.standard_normal((len(xs), len(mats[0]), rows, cols))
            q, p = (np.eye(rows), None) if self.rotation is None else self.rotation[i]
            p = np.eye(cols) if p is None else p
            a = q @ self.a[i] @ q.T
            n = p @ np.diag(np.arange(cols, 0, -1.0)) @ p.T
            ts = [np.zeros((rows, cols))] * len(mats[0]) if self.target is None else self.target[i]
            point = []
            for x, ws, bs in zip(xs, mats, b, strict=True):
                g = [
                    scale * (2.0 * a @ (w - q @ t @ p.T) @ n + q @ bb @ p.T)
                    for w, t, bb in zip(ws, ts, bs, strict=True)
                ]
                point.append((x, g, self.space.pullback(i, x, g)))
            out.append(point)
        return out

    def gradients(self, arrays: Sequence[Array], t: int, scale: float = 1.0) -> list[Array]:
        """G_t at the points the arrays hold (float64), times ``scale``, as the parameters'
        gradients."""
        out: list[Array] = []
        for i, point in enumerate(self._oracle(arrays, t, scale)):
            out += self.space.assemble(i, [egrad for _, _, egrad in point])
        return out

    def view_gradients(self, arrays: Sequence[Array], t: int) -> list[Array]:
        """G_t with respect to every element's view (G_W, or the frames' own), flat."""
        return [
            v
            for i, point in enumerate(self._oracle(arrays, t, 1.0))
            for x, g, egrad in point
            for v in self.space.view_gradient(i, x, g, egrad)
        ]


class Run:
    """One optimizer of the target over fresh parameters at given points.

    The factory is called as ``factory(space.argument(params))``: the list of
    ``torch.nn.Parameter`` (Stiefel) or of parameter groups (the ten; ``spaces``); the
    optimizer's ``step()`` reads ``.grad``. Hyperparameters are set as torch's schedulers set
    them, in every ``param_groups`` entry (``set``)."""

    def __init__(
        self, factory: Callable[..., Any], space: Any, arrays: Sequence[Array], dtype: torch.dtype
    ):
        self.dtype, self.space = dtype, space
        self.params = [torch.nn.Parameter(torch.tensor(a, dtype=dtype)) for a in arrays]
        try:
            self.optimizer = factory(space.argument(self.params))
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # any failure of foreign code, SystemExit included
            raise TargetError(f"the factory raised {type(err).__name__}: {err}") from None
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TargetError(
                f"the factory returned {type(self.optimizer).__name__}, not a torch.optim.Optimizer"
            )
        if not self.optimizer.param_groups:
            raise TargetError("the factory's optimizer has no param_groups")

    def points(self) -> list[Array]:
        return [p.detach().cpu().numpy().astype(np.float64) for p in self.params]

    def rounded(self, arrays: Sequence[Array]) -> list[Array]:
        """Arrays rounded to the run's dtype (and back to float64): what the target is given."""
        return [torch.tensor(a, dtype=self.dtype).double().numpy() for a in arrays]

    def has(self, key: str) -> bool:
        return all(key in g for g in self.optimizer.param_groups)

    def get(self, key: str) -> Any:
        return self.optimizer.param_groups[0][key]

    def set(self, key: str, value: Any) -> None:
        for group in self.optimizer.param_groups:
            group[key] = value

    def step(self, grads: Sequence[Array | None]) -> None:
        for p, g in zip(self.params, grads, strict=True):
            p.grad = None if g is None else torch.tensor(g, dtype=self.dtype)
        self.optimizer.step()

    def clone(self, factory: Callable[..., Any]) -> Run:
        """A new optimizer of the factory at this run's points with this run's state loaded."""
        other = Run(factory, self.space, self.points(), self.dtype)
        other.optimizer.load_state_dict(copy.deepcopy(self.optimizer.state_dict()))
        return other


def drive(
    run: Run,
    problem: Problem,
    steps: int,
    start: int = 0,
    scale: float = 1.0,
    decay: float = 0.0,
) -> list[list[Array]]:
    """``steps`` steps with the oracle's gradients at the run's own points (plus decay·x, as a
    coupled weight decay adds it); the points after each step (the first entry: before any)."""
    path = [run.points()]
    for t in range(start, start + steps):
        grads = problem.gradients(path[-1], t, scale)
        grads = [g + decay * x for g, x in zip(grads, path[-1], strict=True)] if decay else grads
        run.step(run.rounded(grads))
        path.append(run.points())
    return path
