"""A whole model's frames and points put back on their manifolds: after a cast (``reproject``),
and as the projected average of averaged iterates (``projected_average``, for SWA or EMA).

Both act on the points that ``torch_port.optim.groups.parameter_groups`` finds in the model;
``torch_port.nn`` exports them.
"""

from __future__ import annotations

from torch import nn

from torch_port.optim.groups import parameter_groups
from torch_port.optim.points import reproject as reproject_groups


def reproject(model: nn.Module) -> dict[str, float]:
    """Put every frame and point of ``model`` back on its manifold, in place
    (``torch_port.optim.reproject`` of ``parameter_groups(model)``), e.g. after
    ``model.to(torch.float64)``; returns the largest residual found before, per group."""
    return reproject_groups(parameter_groups(model))


#: Geometries whose points are their frames, so that an entrywise average of iterates followed
#: by the polar factor is the projected (extrinsic) mean; the other factors are fixed only up
#: to a group action (R1's SVD, the quotients, P1's alignment), where an entrywise average of
#: representatives is not an average of points.
AVERAGED_GEOMETRIES = ("stiefel", "stiefel_pair", "block_stiefel_pair")


def projected_average(averaged: nn.Module) -> nn.Module:
    """The projected average of the frames of an averaged model, e.g. of
    ``torch.optim.swa_utils.AveragedModel(model)`` after its ``update_parameters`` calls (SWA,
    or EMA with ``get_ema_multi_avg_fn``): a copy of the averaged module with every frame
    replaced by the polar factor of its average, argmin_{W ∈ St(d, r)} Σ_i ‖W − W_i‖_F², the
    nearest frame to the entrywise (weighted) mean. The averaged model itself keeps the
    Euclidean mean, which later updates need. ValueError for points of the other geometries
    (``AVERAGED_GEOMETRIES``)."""
    import copy

    module = getattr(averaged, "module", averaged)
    others = sorted(
        {g["geometry"] for g in parameter_groups(module) if g.get("geometry")}
        - set(AVERAGED_GEOMETRIES)
    )
    if others:
        raise ValueError(
            f"projected_average: the model has points of {', '.join(others)}, whose factors are "
            "fixed only up to a group action, so that an entrywise average of factors is not "
            f"an average of points; it averages frames ({', '.join(AVERAGED_GEOMETRIES)})"
        )
    projected = copy.deepcopy(module)
    reproject(projected)
    return projected
