"""Floors of the frame step (``rattn bench port``, ``rattn bench model``): only the batched
products, and the passes over whole frames, that a route of the step needs, into outputs kept
between calls. A floor is a lower bound of any step that takes its route with torch's eager
operators; the port's step is measured against it in the same run.

torch is imported inside the methods (``rattn certify`` runs without torch).
"""

from __future__ import annotations

import math
from typing import Any

#: Learning rate of every optimizer in the benchmark (Gaussian gradients of unit entries).
PORT_LR = 1e-3


class ProductFloor:
    """The batched products any projection-and-polar step needs per frame: rgrad
    G − W sym(WᵀG), the Gram AᵀA and A·(AᵀA)^{-1/2}, transport m − Y sym(Yᵀm): three
    r×d·d×r and three d×r·r×r products, all in the working dtype, into outputs kept between
    calls (a lower bound: nothing else of the step is done, nothing is allocated), for frame
    parameters ``ps`` with their gradients attached. With ``passes``, also the passes over
    whole frames that every step of the frame-moment Adam rule makes besides them: the
    gradient's finiteness check (a sum), the frame norm of g (one fused reduction), the moment
    update m ← lerp(m, g, 1 − β1) and the step A = W + c·m."""

    def __init__(self, ps: list[Any], passes: bool = False) -> None:
        import torch

        self.ps, self.state = ps, {}
        self.small = [
            torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
            .expand(*p.shape[:-2], -1, -1)
            .contiguous()
            for p in ps
        ]
        self.out_small = [torch.empty_like(s) for s in self.small]
        self.out_big = [torch.empty_like(p) for p in ps]
        #: With ``passes``: each parameter's moment and per-frame step factor c.
        self.moments = [
            (torch.zeros_like(p), torch.full_like(p[..., :1, :1], -PORT_LR))
            for p in (ps if passes else [])
        ]

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for p, s, o_s, o_b in zip(
                self.ps, self.small, self.out_small, self.out_big, strict=True
            ):
                x, g = p.detach(), p.grad
                for _ in range(3):
                    torch.matmul(x.transpose(-1, -2), g, out=o_s)
                    torch.matmul(x, s, out=o_b)
            for p, (m, c), a in zip(self.ps, self.moments, self.out_big, strict=False):
                p.grad.sum()
                torch.linalg.vector_norm(p.grad, dim=(-2, -1))
                m.lerp_(p.grad, 0.1)
                torch.addcmul(p.detach(), m, c, out=a)


class LinearityFloor:
    """The batched products and passes of the route that the frame step is not built on: the
    moment transported lazily through the projection's linearity,

        m_k = β1·P_W(m_{k−1}) + (1 − β1)·P_W(G) = P_W(T),  T = β1·m_{k−1} + (1 − β1)·G,

    with P_W(T) = T − W sym(WᵀT) formed in place in T (no copy of G, no Riemannian gradient
    tensor, no transport at the end of the step), and the norm of g = P_W(G) from the identity
    ‖P_W(G)‖² = ‖G‖² − ‖sym(WᵀG)‖², exact only when WᵀW = I. Per frame: WᵀG, WᵀT, W·S_T,
    AᵀA and A·H (three r×d·d×r and two d×r·r×r products), and three passes over whole frames:
    ‖G‖ (which also validates G), T = lerp(m, G, 1 − β1) and A = W + c·m. As ``ProductFloor``,
    all into outputs kept between calls, with identity matrices for S and H and nothing of the
    r×r work done: a lower bound of that route's step, timed so that its saving over the step
    the port takes is measured rather than estimated (``docs/performance.md``)."""

    def __init__(self, ps: list[Any]) -> None:
        import torch

        self.ps, self.state = ps, {}  # as ProductFloor: no optimizer state counted
        frames = [_frames(p.detach()) for p in ps]
        self.moments = [torch.zeros_like(w) for w in frames]
        self.small = [
            torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
            .expand(w.shape[0], -1, -1)
            .contiguous()
            for w in frames
        ]
        self.out_small = [torch.empty_like(s) for s in self.small]
        self.out_big = [(torch.empty_like(w), torch.empty_like(w)) for w in frames]
        self.c = [torch.full_like(w[:, :1, :1], -PORT_LR) for w in frames]

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for p, m, s, o_s, (a, y), c in zip(
                self.ps, self.moments, self.small, self.out_small, self.out_big, self.c, strict=True
            ):
                w, g = _frames(p.detach()), _frames(p.grad)
                torch.linalg.vector_norm(g, dim=(-2, -1))
                torch.bmm(w.transpose(-1, -2), g, out=o_s)
                m.lerp_(g, 0.1)
                torch.bmm(w.transpose(-1, -2), m, out=o_s)
                m.baddbmm_(w, s, alpha=-1.0)
                torch.addcmul(w, m, c, out=a)
                torch.bmm(a.transpose(-1, -2), a, out=o_s)
                torch.bmm(a, s, out=y)


def _frames(t: Any) -> Any:
    """A (..., d, r) tensor as one batch of frames, (n, d, r)."""
    return t.view(-1, *t.shape[-2:])


class RouteFloor:
    """The arithmetic of the step's own route and nothing else: the products, passes and r×r
    work of the frame-moment Adam step as ``torch_port.StiefelFrames`` takes it, on the real
    matrices, into buffers kept between calls, with none of the step's checks (beyond the
    polar factor's own), state bookkeeping or per-point dispatch. Per parameter:

        G's sum (its validation);  S = sym(WᵀG);  g = G − W·S (``baddbmm``: G is copied into
        the output first);  ‖g‖;  m ← lerp(m, g, 1 − β1);  A = W + c·m;
        H = (AᵀA)^{-1/2} by ``torch_port.linalg.polar_plan`` from the Gram formed in the
        frames' dtype (the port's normalisation, series and one host read);  Y = A·H;
        C = H·sym(H·Aᵀm);  m ← m − A·C,

    with W and G fixed, so every call does the same work, m starting at g = P_W(G) (the
    moment of a fixed gradient) and c = −lr/RMS(g) per frame: the port's step when its moments
    equal g, ξ = −lr·g/RMS(g), of norm lr·sqrt(d·r), so that the polar factor's series has the
    port's degree. Y goes into a buffer instead of the parameter (the same product). A step of
    this route can be faster than this floor only by changing the route, its arithmetic, not by
    leaving out checks."""

    def __init__(self, ps: list[Any]) -> None:
        import torch

        self.ps, self.state = ps, {}  # as ProductFloor: no optimizer state counted
        frames = [_frames(p.detach()) for p in ps]
        self.bufs = [tuple(torch.zeros_like(w) for _ in range(4)) for w in frames]  # m, g, A, Y
        self.c = []
        for (m, *_), w, p in zip(self.bufs, frames, ps, strict=True):
            _rgrad(w, _frames(p.grad), out=m)
            rms = torch.linalg.vector_norm(m, dim=(-2, -1), keepdim=True) / math.sqrt(m[0].numel())
            self.c.append(-PORT_LR / rms)
        self.gram = [w.new_empty(w.shape[0], w.shape[-1], w.shape[-1]) for w in frames]

    def step(self) -> None:
        import torch

        from torch_port import linalg
        from torch_port.linalg import sym, transpose

        with torch.no_grad():
            for p, (m, g, a, y), gram, c in zip(self.ps, self.bufs, self.gram, self.c, strict=True):
                w, grad = _frames(p.detach()), _frames(p.grad)
                grad.sum()
                _rgrad(w, grad, out=g)
                torch.linalg.vector_norm(g, dim=(-2, -1))
                m.lerp_(g, 0.1)
                torch.addcmul(w, m, c, out=a)
                torch.bmm(transpose(a), a, out=gram)
                h = linalg.polar_plan(a, gram=gram.to(torch.float64))[0]
                torch.bmm(a, h, out=y)
                m.baddbmm_(a, h @ sym(h @ (transpose(a) @ m)), alpha=-1.0)


def _rgrad(w: Any, grad: Any, out: Any) -> None:
    """P_W(G) = G − W sym(WᵀG) into ``out``, as the port forms it (``baddbmm``: G copied into
    the output first)."""
    import torch

    from torch_port.linalg import sym, transpose

    torch.baddbmm(grad, w, sym(transpose(w) @ grad), alpha=-1.0, out=out)
