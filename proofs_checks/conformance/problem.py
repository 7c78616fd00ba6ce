"""The seeded problem ``rattn conform`` drives an optimizer with, and the driver.

Frames: one St(8, 3) parameter and one batch of two St(6, 2) frames (shape (2, 6, 2)), Haar
distributed, so that both a single frame and a batch, and two sizes, are exercised. Gradients
are known functions of the point: for each frame W of a parameter,

    G_t(W) = 2·A·W·N + B_t,

A a symmetric d×d matrix of the parameter, N = diag(r, …, 1) and B_t a Gaussian d×r matrix of
step t (the gradient of the Brockett cost tr(WᵀAWN) plus a time-varying term, so the moments
see a changing gradient). The rotated problem (A, B_t) → (QAQᵀ, QB_t) has G'(QW) = Q·G(W), which
is what an O(d)-equivariance check needs. Gradients are formed in float64 from the point the
optimizer holds and rounded to its dtype; the reference is given the same rounded values.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import reference as ref

Array = np.ndarray

#: The parameters' shapes: one frame and a batch of two frames.
SHAPES: tuple[tuple[int, ...], ...] = ((8, 3), (2, 6, 2))
DTYPES = {"float64": torch.float64, "float32": torch.float32}


class TargetError(ValueError):
    """The target cannot be used: its factory fails, or its optimizer misbehaves in a way no
    property can measure (raises on a plain step, returns no optimizer)."""


@dataclass(frozen=True)
class Problem:
    """The seeded gradient oracle; ``rotated(q)`` is the same problem seen through Q."""

    seed: int = 0
    shapes: tuple[tuple[int, ...], ...] = SHAPES
    a: tuple[Array, ...] = field(default=(), repr=False)
    rotation: tuple[Array, ...] | None = field(default=None, repr=False)

    @staticmethod
    def make(seed: int = 0, shapes: tuple[tuple[int, ...], ...] = SHAPES) -> Problem:
        rng = np.random.default_rng([seed, 1])
        a = []
        for shape in shapes:
            m = rng.standard_normal((shape[-2], shape[-2]))
            a.append((m + m.T) / 2.0)
        return Problem(seed, shapes, tuple(a))

    def start(self) -> list[Array]:
        """Haar points of each shape (float64), rotated when the problem is."""
        rng = np.random.default_rng([self.seed, 2])
        points = []
        for i, shape in enumerate(self.shapes):
            d, r = shape[-2:]
            st = ref.Stiefel(d, r)
            frames = np.stack([st.random_point(rng) for _ in range(_count(shape))])
            points.append(self._rotate(i, frames).reshape(shape))
        return points

    def _rotate(self, i: int, frames: Array) -> Array:
        return frames if self.rotation is None else self.rotation[i] @ frames

    def rotated(self, seed: int = 3) -> Problem:
        """The problem seen through a Haar Q ∈ O(d) per parameter: start QW, gradients Q·G."""
        rng = np.random.default_rng([self.seed, seed])
        qs = tuple(
            ref.Stiefel(s[-2], s[-2]).random_point(rng) * rng.choice([-1.0, 1.0])
            for s in self.shapes
        )
        return Problem(self.seed, self.shapes, self.a, qs)

    def gradients(self, points: Sequence[Array], t: int, scale: float = 1.0) -> list[Array]:
        """G_t at the given points (float64), times ``scale``."""
        out = []
        for i, (shape, w) in enumerate(zip(self.shapes, points, strict=True)):
            d, r = shape[-2:]
            rng = np.random.default_rng([self.seed, 4, t, i])
            b = self._rotate(i, rng.standard_normal((_count(shape), d, r)))
            a = (
                self.a[i]
                if self.rotation is None
                else self.rotation[i] @ self.a[i] @ self.rotation[i].T
            )
            frames = w.reshape(-1, d, r)
            g = 2.0 * a @ frames @ np.diag(np.arange(r, 0, -1.0)) + b
            out.append((scale * g).reshape(shape))
        return out


def _count(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape[:-2], dtype=int)) if len(shape) > 2 else 1


def frames(array: Array) -> Array:
    """The frames of a parameter's array, shape (k, d, r)."""
    return array.reshape(-1, *array.shape[-2:])


class Run:
    """One optimizer of the target over fresh parameters at given points.

    The factory is called as ``factory(params)`` with a list of ``torch.nn.Parameter``; the
    optimizer's ``step()`` reads ``.grad``. Hyperparameters are set as torch's schedulers set
    them, in every ``param_groups`` entry (``set``)."""

    def __init__(self, factory: Callable[..., Any], points: Sequence[Array], dtype: torch.dtype):
        self.dtype = dtype
        self.params = [torch.nn.Parameter(torch.tensor(p, dtype=dtype)) for p in points]
        try:
            self.optimizer = factory(self.params)
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
        other = Run(factory, self.points(), self.dtype)
        other.optimizer.load_state_dict(copy.deepcopy(self.optimizer.state_dict()))
        return other


def drive(
    run: Run, problem: Problem, steps: int, start: int = 0, scale: float = 1.0
) -> list[list[Array]]:
    """``steps`` steps with the oracle's gradients at the run's own points; the points after
    each step (the first entry: before any)."""
    path = [run.points()]
    for t in range(start, start + steps):
        run.step(run.rounded(problem.gradients(path[-1], t, scale)))
        path.append(run.points())
    return path
