"""PORT-4: the port at the ends of the dtypes' ranges (gradients whose norm overflows float32,
float64 subnormal gradients), and with its defaults.

As in ``port``, torch and the port are imported inside the checks, and every negative control
substitutes a wrong variant into the port's own code (``harness.substituted``), so the control
goes through the path training takes.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

from proofs_checks.harness import substituted
from proofs_checks.propositions.port import NEAR_MISS
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

#: PORT-4: one (16, 4) frame stack, lr, and the scales at the ends of the dtypes' ranges.
ENDS_D, ENDS_R, ENDS_FRAMES, ENDS_LR = 16, 4, 3, 1e-2
FLOAT32_HUGE = 2.0**127  # entries of |cG| ≤ 1.7e38 < float32's largest, ‖cG‖ and WᵀcG beyond
FLOAT64_SUBNORMAL = 2.0**-1060


def _ends_exercised(ctx: Context, dtype: str, points: str) -> dict[str, object]:
    return {
        "sizes": f"{ENDS_FRAMES} frames of St({ENDS_D}, {ENDS_R})",
        "rules": "riemannian_adam (ε = 0), normalized_rsgd",
        "points": points,
        "steps": 1,
        "dtypes": dtype,
        "seeds": ctx.seed,
    }


def _one_step(rule: str, w0, grad):
    """One step from a fresh optimizer: the new frames."""
    import torch

    from torch_port import NormalizedRSGD, RiemannianAdam

    w = torch.nn.Parameter(w0.clone())
    group = [{"params": [w], "geometry": "stiefel"}]
    opt = (
        RiemannianAdam(group, lr=ENDS_LR, eps=0.0)
        if rule == "riemannian_adam"
        else NormalizedRSGD(group, lr=ENDS_LR)
    )
    w.grad = grad
    opt.step()
    return w.detach()


def _gap(rule: str, w0, grad, scaled) -> float:
    """max|W_1(cG) − W_1(G)| (inf when the port refuses the scaled step)."""
    try:
        return float((_one_step(rule, w0, scaled) - _one_step(rule, w0, grad)).abs().max())
    except ValueError:
        return math.inf


def _naive_frame_rms(original):
    """``transforms.frame_rms`` without its overflow route: ‖g‖/sqrt(entries) as computed."""

    def variant(geometry, x, g):
        import torch

        n = geometry.frame_norms(x, g)
        return n / torch.tensor(math.sqrt(geometry.frame_sizes()[0]), dtype=n.dtype)

    return variant


def _naive_ratio_step(original):
    """``transforms._ratio_step`` without its rescaling: k = num/den even where c·k overflows."""

    def variant(geometry, u, num, den, c):
        import torch

        k = torch.where(den == 0, torch.zeros_like(den), torch.full_like(den, num) / den)
        return tuple(u), k

    return variant


def overflowing_gradients(ctx: Context, wrong: bool) -> Outcome:
    """float32 frames, gradients G with uniform entries in [−1, 1] and c = 2^127 for all frames
    but the last (c = 1): the entries of cG are representable but ‖cG‖ and WᵀcG overflow
    float32, so the port's overflow routes (``frame_rms``'s scaled norm, the projection at scale
    1) are taken for those frames, and not for the last. Adam (ε = 0) and the normalised rule
    are of degree zero per frame, so W_1(cG) = W_1(G) in exact arithmetic: their
    difference is within 2·``step_error``(16, 4, 2^-24) (two float32 steps). Control:
    ``frame_rms`` without its overflow route, substituted into ``torch_port.optim.transforms``."""
    import torch

    from proofs_checks.bounds import step_error
    from torch_port import Stiefel
    from torch_port.optim import transforms

    g = torch.Generator().manual_seed(ctx.seed)
    w0 = Stiefel(ENDS_D, ENDS_R).random_point(g, (ENDS_FRAMES,), dtype=torch.float32)
    grad = (2 * torch.rand(w0.shape, generator=g, dtype=torch.float64) - 1).to(torch.float32)
    # The last frame's gradient stays at scale 1: the batch mixes frames that take the overflow
    # route with one that does not (each frame's step is its own: degree zero per frame).
    scales = torch.tensor([FLOAT32_HUGE] * (ENDS_FRAMES - 1) + [1.0])[:, None, None]
    scaled = grad * scales
    naive = substituted(transforms, "frame_rms", _naive_frame_rms(transforms.frame_rms))
    with naive if wrong else contextlib.nullcontext():
        worst = max(_gap(rule, w0, grad, scaled) for rule in ("riemannian_adam", "normalized_rsgd"))
    return Outcome.bound(
        worst,
        2 * step_error(ENDS_D, ENDS_R, 2.0**-24),
        "max|W_1(2^127·G) − W_1(G)|, float32",
        _ends_exercised(ctx, "float32", "random points, uniform G, c = 2^127 on 2 of 3 frames"),
    )


def subnormal_gradients(ctx: Context, wrong: bool) -> Outcome:
    """float64 frames at W = [I; 0] (each of three), a gradient G tangent there (skew top block:
    P_W(G) = G exactly), G_s = fl(2^-1060·G) (subnormal entries) and G' = G_s·2^1060 (exact):
    W_1(G_s) against W_1(G'), within 2·``step_error``(16, 4) + lr·sqrt(d·r)·δ, δ RA-7's
    ``subnormal_grid`` (the subnormal values' rounding moves the step's length ‖ξ‖ = lr·sqrt(d·r)
    by a relative δ, and the polar map moves the point by no more). num/den of the step's factor
    overflows here, so the port's rescaled route of ``_ratio_step`` is taken. Control: that
    route removed (substituted into ``torch_port.optim.transforms``)."""
    import numpy as np
    import torch

    from proofs_checks.bounds import step_error
    from proofs_checks.propositions.ra7_degree import subnormal_grid
    from torch_port.optim import transforms

    rng = np.random.default_rng([ctx.seed, 9])
    grad = rng.standard_normal((ENDS_FRAMES, ENDS_D, ENDS_R))
    top = grad[:, :ENDS_R]
    grad[:, :ENDS_R] = 0.5 * (top - top.transpose(0, 2, 1))
    g_sub = FLOAT64_SUBNORMAL * grad
    g_back = g_sub / FLOAT64_SUBNORMAL  # exact
    w0 = torch.tensor(np.broadcast_to(np.eye(ENDS_D, ENDS_R), g_sub.shape).copy())
    naive = substituted(transforms, "_ratio_step", _naive_ratio_step(transforms._ratio_step))
    worst = 0.0
    with naive if wrong else contextlib.nullcontext():
        for rule in ("riemannian_adam", "normalized_rsgd"):
            delta = max(subnormal_grid(rule, g, FLOAT64_SUBNORMAL) for g in g_back)
            tol = 2 * step_error(ENDS_D, ENDS_R) + ENDS_LR * math.sqrt(ENDS_D * ENDS_R) * delta
            gap = _gap(rule, w0, torch.tensor(g_back), torch.tensor(g_sub))
            worst = max(worst, gap / tol)
    return Outcome.bound(
        worst,
        1.0,
        "max|W_1(G_s) − W_1(G')| / bound, float64, subnormal G_s",
        _ends_exercised(ctx, "float64", "W = [I; 0], G tangent there, c = 2^-1060"),
    )


#: The defaults of ``RiemannianAdam`` and of ``transforms.scale_by_adam`` (DESIGN §5 and
#: torch's AdamW): written here, not read from the code.
PORT_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}
#: The gradients' size in the defaults check: RMS(g) like ε, so that a changed ε shows.
DEFAULTS_SCALE = 1e-8


def _eps_default_times(k: float):
    """``scale_by_adam`` whose default ε is k·1e-8 (k = 2: doubled; k = 1 + 1e-8: a near miss
    that moves steps along gradients of RMS 1e-8 by about 1e-8/2 relative)."""

    def make(original):
        def variant(b1=0.9, b2=0.999, eps=k * 1e-8, moment="frame", reduction="mean"):
            return original(b1, b2, eps, moment, reduction)

        return variant

    return make


#: PORT-4's gross control of the defaults: the default ε doubled.
EPS_DOUBLED = _eps_default_times(2.0)


def defaults(ctx: Context, wrong: bool, variant: Callable = EPS_DOUBLED) -> Outcome:
    """``RiemannianAdam(params)`` and a ``ChainOptimizer`` of ``chain(scale_by_adam(),
    scale(−1e-3))``, both with their defaults, 4 float64 steps on a (16, 4) frame stack along
    gradients of size 1e-8 (where ε matters), against ``reference.optim.riemannian_adam`` at
    ``PORT_DEFAULTS``: max|W_t − W_t^ref| within 4·``step_error``(16, 4). Control: the default
    ε of ``scale_by_adam`` doubled, substituted into ``torch_port.optim.transforms``."""
    import numpy as np
    import torch

    import reference as ref
    from proofs_checks.bounds import step_error
    from torch_port import RiemannianAdam, Stiefel
    from torch_port.optim import ChainOptimizer, transforms

    g = torch.Generator().manual_seed(ctx.seed)
    w0 = Stiefel(ENDS_D, ENDS_R).random_point(g, dtype=torch.float64)
    grads = [
        DEFAULTS_SCALE * torch.randn(w0.shape, generator=g, dtype=torch.float64) for _ in range(4)
    ]
    rule = ref.optim.riemannian_adam(
        PORT_DEFAULTS["lr"], PORT_DEFAULTS["betas"], PORT_DEFAULTS["eps"]
    )
    geo = ref.Stiefel(ENDS_D, ENDS_R)
    x, expected = w0.numpy().copy(), []
    state = rule.init(geo, x)
    for grad in grads:
        x, state = rule.step(geo, x, grad.numpy(), state)
        expected.append(x)
    builders = {
        "RiemannianAdam(params)": lambda group: RiemannianAdam(group),
        "chain(scale_by_adam(), scale(−lr))": lambda group: ChainOptimizer(
            group,
            lambda grp: transforms.chain(
                transforms.scale_by_adam(), transforms.scale(-PORT_DEFAULTS["lr"])
            ),
        ),
    }
    eps_2 = substituted(transforms, "scale_by_adam", variant(transforms.scale_by_adam))
    worst = 0.0
    with eps_2 if wrong else contextlib.nullcontext():
        for build in builders.values():
            w = torch.nn.Parameter(w0.clone())
            opt = build([{"params": [w], "geometry": "stiefel"}])
            for grad, want in zip(grads, expected, strict=True):
                w.grad = grad.clone()
                opt.step()
                worst = max(worst, float(np.abs(w.detach().numpy() - want).max()))
    return Outcome.bound(
        worst,
        4 * step_error(ENDS_D, ENDS_R),
        "max_t max|W_t − W_t^ref|",
        {
            "sizes": f"one ({ENDS_D}, {ENDS_R}) frame",
            "options": ", ".join(builders),
            "steps": len(grads),
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def defaults_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``defaults``; control, a near miss: the default ε 10·``NEAR_MISS`` relative larger
    (substituted into ``torch_port.optim.transforms``)."""
    return defaults(ctx, wrong, variant=_eps_default_times(1 + 10 * NEAR_MISS))


register(
    Proposition(
        id="PORT-4",
        title="The port at the ends of the dtypes' ranges, and with its defaults",
        statement=(
            r"One step of the port's Riemannian Adam ($\varepsilon=0$) and normalised rule, "
            r"both of degree zero in the gradient, is the same along $cG$ as along $G$ when "
            r"$\|cG\|$ and $W^\top cG$ overflow float32 ($c=2^{127}$) and when the entries of "
            r"$cG$ are float64 subnormals ($c=2^{-1060}$, at $W=[I;0]$ with $G$ tangent "
            r"there), to the rounding of the step and of the subnormal values; and "
            r"\texttt{RiemannianAdam} and "
            r"\texttt{scale\_by\_adam} with their defaults are the rule with "
            r"$\eta=10^{-3}$, $\beta=(0.9,0.999)$, $\varepsilon=10^{-8}$."
        ),
        hypotheses=(
            "Stiefel frames (16, 4), the embedded metric and the polar retraction",
            "one step from a fresh state for the degree claims; 4 steps for the defaults",
        ),
        checks=(
            Check(
                "float64",
                "float32 gradients whose norm overflows",
                overflowing_gradients,
                "frame_rms without its overflow route, substituted into the port",
            ),
            Check(
                "float64",
                "float64 subnormal gradients",
                subnormal_gradients,
                "the step factor's rescaled route removed, substituted into the port",
            ),
            Check(
                "float64",
                "the defaults",
                defaults,
                "scale_by_adam's default ε doubled, substituted into the port",
            ),
            Check(
                "float64",
                "resolution: a default ε 1e-8 relative off is caught",
                defaults_resolution,
                f"near miss: scale_by_adam's default ε times 1 + {10 * NEAR_MISS:g}",
            ),
        ),
        requires=("torch",),
    )
)
