"""Riemannian optimizers as ``torch.optim.Optimizer`` subclasses (DESIGN §5, §7).

Each preset mirrors a preset of ``reference/optim.py`` as the same chain of transformations
(``transforms``), so that float64 trajectories agree with the reference to rounding:

========================  =====================================================================
``RiemannianAdam``        ``reference.optim.riemannian_adam`` (moment "frame" or "elementwise")
``RiemannianMomentum``    ``reference.optim.riemannian_momentum``
``RSGD``                  ``reference.optim.rsgd``
``NormalizedRSGD``        ``reference.optim.normalized_rsgd``
``ChainOptimizer``        any chain of ``transforms`` (docs/torch_port.md, "Composing a rule")
========================  =====================================================================

A parameter group names its geometry (``GEOMETRIES``, the ten design points and "stiefel"):

- ``{"params": [W, ...], "geometry": "stiefel"}``: every parameter is a batch of frames of shape
  (..., d, r), one frame per trailing d×r matrix; options "retraction" ("polar", default;
  "polar_svd", "qr", "exp") and "metric" ("embedded", default; "canonical").
- ``{"params": [U, S, V], "geometry": "fixed_rank_embedded"}`` and the other nine: the group's
  parameters, in order, are the factors of ONE batched point, e.g. R1 (U (..., m, r),
  S (..., r, r), V (..., n, r)), R2 (A, B), P1/P2/P3 (U, V); sizes are inferred from the shapes
  (optional keys "m", "n", "r" are checked against them). Options: "retraction" (R1, P1:
  "projection"/"qr"; P2, P3: as Stiefel), "metric" (R2: "preconditioned"/"balanced"). A block
  variant takes the per-head layout: row factors (..., p, m, r), column factors (..., q, n, r),
  r×r cores (..., G, r, r), e.g. ``{"params": [U, S, V], "geometry":
  "block_fixed_rank_embedded", "n_heads": 12, "n_kv_heads": 4}`` (defaults: n_heads = p,
  n_kv_heads = q), with optional "pattern" and "groups" ("components"/"all").
- Any geometry group may set "gradient": "euclidean" (default "riemannian"): the rule then acts
  on the Euclidean gradient in the ambient space, with no projection and no transport, and the
  retraction alone puts the point back on its manifold (not for R1 and P1, whose tangent
  vectors have their own layout).

Groups without a geometry hold plain parameters and are updated, in the same optimizer, by AdamW
with decoupled decay in torch's convention and torch's arithmetic (``torch.optim.adamw.adamw``
with foreach, bitwise the single-tensor path's), with that group's lr, betas, eps and
weight_decay.

State. A Stiefel parameter keeps "step", "exp_avg" (the first moment, a tangent vector at the
current frame) and "sqrt_v" (√v, one scalar per frame: shape (...,) for a batch (..., d, r);
full size only for the ``moment="elementwise"`` ablation); ``RiemannianMomentum`` keeps "step"
and "momentum_buffer"; ``RSGD`` and ``NormalizedRSGD`` keep "step". The state of a point of the
other geometries lives with the group's FIRST parameter under the same keys, with tangent
vectors as tuples of tensors in the geometry's tangent layout (R1: (M, U_p, V_p); P1:
(Ω, U_p, V_p); block variants: the stacked group layout of ``blocks.BlockGeometry``) and "sqrt_v"
of shape (..., *frame_shape) (e.g. (..., 2) for a Stiefel pair, (..., G) for a block R1). Plain
parameters keep torch's "step", "exp_avg" and "exp_avg_sq".

Weight decay. On frames (Stiefel, P1, P2, P3 and their block variants) it does nothing: the
Riemannian gradient of (λ/2)‖W‖² on St(d, r) is P_W(λW) = 0 (RA-5); asking for it raises a
``FrameDecayWarning`` and the decay is not applied. On R1 and R2 (and their block variants) it
is the reference's ``decay="coupled"``: λ times the stored factors is added to the factor
gradient before the Riemannian gradient is taken.

Bad input. One guard (``torch_port.optim.guard``) checks a group when it is added and when its
values change, a step and a load, before any parameter or state changes: a non-finite gradient
raises ValueError naming the parameter and the count of bad entries, or, for groups built with
``skip_nonfinite=True``, skips the whole step with a ``NonFiniteGradientWarning``. A point is
checked to lie on its manifold when its group is added, and again at its first step, with
the measured residual in the error. All updates of points are
computed before any is written, so an error raised while computing one (e.g. a step that
overflows or leaves the rank-r manifold) leaves every parameter and every state as it was.
"""

from torch_port.geometries import GEOMETRIES
from torch_port.optim import transforms
from torch_port.optim.guard import values as checks
from torch_port.optim.guard.values import (
    FRAME_GEOMETRIES,
    FrameDecayWarning,
    NonFiniteGradientWarning,
)
from torch_port.optim.optimizer import ChainOptimizer
from torch_port.optim.points import reproject
from torch_port.optim.presets import RSGD, NormalizedRSGD, RiemannianAdam, RiemannianMomentum
from torch_port.optim.transforms import MOMENTS, REDUCTIONS

__all__ = [
    "FRAME_GEOMETRIES",
    "GEOMETRIES",
    "MOMENTS",
    "REDUCTIONS",
    "RSGD",
    "ChainOptimizer",
    "FrameDecayWarning",
    "NonFiniteGradientWarning",
    "NormalizedRSGD",
    "RiemannianAdam",
    "RiemannianMomentum",
    "checks",
    "reproject",
    "transforms",
]
