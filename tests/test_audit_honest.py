"""Honest training loops are never flagged by ``rattn audit``: over 20 seeds each (300 runs, about
half a minute), every configuration below records every step and the audit says PASSED, every
row passing (no false alarm, and nothing left not auditable). A
configuration is a rule (the four presets, geoopt's two) and a loop: float64 or float32
parameters, bfloat16 autocast, gradient clipping, accumulation over micro-batches, a linear
warm-up from lr 0, a closure, sampling every third step, ascent of the negated loss
(``maximize``; geoopt keeps the flag in its groups and descends, as it is replayed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch_port as tp  # noqa: E402
from proofs_checks.audit import replay as pa  # noqa: E402
from proofs_checks.audit.report import format_table  # noqa: E402
from torch_port import audit  # noqa: E402

STEPS = 8
SEEDS = range(20)


def _frames(gen, dtype, rule: str):
    """Two St(8, 3) frames: a parameter, or geoopt's ManifoldParameter on its Stiefel."""
    w = tp.Stiefel(8, 3).random_point(gen, (2,)).to(dtype)
    if not rule.startswith("geoopt"):
        return torch.nn.Parameter(w)
    geoopt = pytest.importorskip("geoopt")
    return geoopt.ManifoldParameter(w, manifold=geoopt.Stiefel(canonical="canonical" in rule))


def _optimizer(rule: str, frames: list, plain: list, **flags):
    if rule.startswith("geoopt"):
        geoopt = pytest.importorskip("geoopt")
        cls = geoopt.optim.RiemannianAdam if "adam" in rule else geoopt.optim.RiemannianSGD
        # SGD's lr multiplies the raw gradient: 1e-3 keeps its steps within the bound's 1/2
        options = {"lr": 1e-2} if "adam" in rule else {"lr": 1e-3, "momentum": 0.9}
        return cls([*frames, *plain], **options, **flags)  # geoopt keeps maximize, ignores it
    cls = {
        "adam": tp.RiemannianAdam,
        "momentum": tp.RiemannianMomentum,
        "rsgd": tp.RSGD,
        "normalized": tp.NormalizedRSGD,
    }[rule]
    options = {"trust_radius": 0.05} if rule in ("adam", "rsgd") else {}
    groups = [{"params": frames, "geometry": "stiefel"}, {"params": plain}]
    return cls(groups, lr=1e-2, **options, **flags)


LOOPS = {
    "float64": {"dtype": torch.float64},
    "float32": {"dtype": torch.float32},
    "autocast": {"dtype": torch.float32, "autocast": True},
    "clipping": {"dtype": torch.float32, "clip": 0.5},
    "accumulation": {"dtype": torch.float64, "micro": 3},
    "warmup": {"dtype": torch.float64, "warmup": 3},
    "closure": {"dtype": torch.float32, "closure": True},
    "every3": {"dtype": torch.float64, "every": 3},
    "maximize": {"dtype": torch.float64, "maximize": True},
}
CASES = [(rule, "float32") for rule in ("momentum", "rsgd", "normalized")]
CASES += [("adam", loop) for loop in LOOPS]
CASES += [(f"geoopt_{r}_{m}", "float32") for r in ("adam", "sgd") for m in ("canonical", "euclid")]
CASES += [("geoopt_adam_canonical", "maximize")]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("rule", "loop"), CASES, ids=[f"{r}-{loop}" for r, loop in CASES])
def test_an_honest_loop_passes(tmp_path, rule, loop, seed) -> None:
    o = LOOPS[loop]
    gen = torch.Generator().manual_seed(seed)
    q, k = _frames(gen, o["dtype"], rule), _frames(gen, o["dtype"], rule)
    torch.manual_seed(seed)  # the linear layer's initialisation
    inp = torch.nn.Linear(4, 8, dtype=o["dtype"])
    x = torch.randn(12, 4, generator=gen, dtype=o["dtype"])
    y = torch.randn(12, generator=gen, dtype=o["dtype"])
    ascent = o.get("maximize", False)
    flags = {"maximize": True} if ascent else {}
    opt = _optimizer(rule, [q, k], list(inp.parameters()), **flags)
    warmup = o.get("warmup")
    schedule = (
        torch.optim.lr_scheduler.LambdaLR(opt, lambda t: min(t / warmup, 1.0)) if warmup else None
    )

    def loss_of(rows):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=o.get("autocast", False)):
            h = inp(x[rows])
            s = torch.einsum("bi,hir,hjr,bj->b", h, q, k, h)
        loss = ((s.to(o["dtype"]) - y[rows]) ** 2).mean()
        return -loss if ascent else loss

    def closure():
        opt.zero_grad()
        loss = loss_of(slice(None))
        loss.backward()
        return loss

    micro = o.get("micro", 1)
    path = tmp_path / "run.npz"
    with audit.record(opt, path, every=o.get("every", 1)):
        for _ in range(STEPS):
            if o.get("closure"):
                opt.step(closure)
            else:
                opt.zero_grad()
                for part in range(micro):
                    (loss_of(slice(part, None, micro)) / micro).backward()
                if "clip" in o:
                    torch.nn.utils.clip_grad_norm_([q, k, *inp.parameters()], o["clip"])
                opt.step()
            if schedule is not None:
                schedule.step()
    result = pa.audit(path)
    assert result["verdict"] == "passed", format_table(result)
    assert result["counts"]["pass"] == len(result["steps"]) > 0
    recorded = STEPS // o.get("every", 1)
    assert len({r["step"] for r in result["steps"]}) == recorded
