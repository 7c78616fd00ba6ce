"""PORT-10: converting a model's attention (``torch_port.convert.riemannian_attention``) is exact
where the geometry can hold the weights, nearest where it cannot, and the converted module reads
its factors as the geometry defines them.

The model is a LLaMA-style attention module with separate q/k/v/o projections and q/k/v
biases, plain (4 query heads, 4 key/value heads) and grouped (4 over 2), in float64; every
measurement is taken through the module's own projections (what its forward reads), and every
expected value from the weights before conversion or from NumPy and ``reference``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from proofs_checks.bounds import FLOAT64_U, frame_error, gamma
from proofs_checks.harness import substituted
from proofs_checks.propositions.convert_models import (
    CONVERT_D,
    CONVERT_K,
    HEADS,
    TOKENS,
    FusedView,
    factors,
    fused_module,
    maps,
    separate_module,
)
from proofs_checks.registry import Check, Context, Outcome, Proposition, register

EXACT = ("fixed_rank_embedded", "fixed_rank_quotient")
#: The near miss of the exact check: R1's singular values this much relative too large.
SINGULAR_NEAR_MISS = 1e-12


def _condition(a: np.ndarray, b: np.ndarray, p: int) -> float:
    """max_h σ_1/σ_k of A_h B_{h//p}ᵀ (NumPy's SVD)."""
    s = np.linalg.svd(a @ np.repeat(b, p, axis=0).transpose(0, 2, 1), compute_uv=False)
    return float(np.max(s[:, 0] / s[:, CONVERT_K - 1]))


def _relative(kappa: float, inner: int) -> float:
    """The relative error of a converted bilinear map: 8·k·κ·u for the conversion (thin QR and
    SVD backward stable; the bias least squares of condition κ) plus 2γ_{d+1} for the two
    projections (inner dimension d, and the bias) and γ_inner for their product."""
    return 8 * CONVERT_K * kappa * FLOAT64_U + 2 * gamma(CONVERT_D + 1) + gamma(inner)


def _sizes(f: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {r: np.linalg.norm(f[r], ord=2, axis=(1, 2)) for r in f}


def _singular_values_stretched(original: Callable) -> Callable:
    """``convert.points.nearest`` whose R1 core is diag(s)·(1 + ``SINGULAR_NEAR_MISS``)."""

    def variant(label: str, base: Any, a: Any, b: Any) -> tuple:
        x = original(label, base, a, b)
        if base.name != "fixed_rank_embedded":
            return x
        return x[0], x[1] * (1.0 + SINGULAR_NEAR_MISS), x[2]

    return variant


def _heads_modulo(original: Callable) -> Callable:
    """``convert.per_query`` pairing query head h with key/value head h mod g (not h // p)."""
    return lambda t, p: t.repeat((p,) + (1,) * (t.ndim - 1)) if p > 1 else t


def exact_conversion(ctx: Context, wrong: bool, control: str = "singular") -> Outcome:
    """For each (heads, key/value heads) of ``HEADS`` and each geometry of ``EXACT`` (R1, R2;
    their block variants under GQA), on QK and VO at once: the logits L_h(i, j) and the
    value-output Z(i) of ``TOKENS`` random tokens, formed from the module's projections before
    and after ``riemannian_attention``, differ by at most ρ·M: for L, M = (‖x_i‖‖W_Q^h‖₂ +
    ‖b_q^h‖)(‖x_j‖‖W_K^g‖₂ + ‖b_k^g‖) and ρ = ``_relative``(κ_QK, k); for Z (2-norm),
    M = Σ_h (‖x_i‖‖W_V^g‖₂ + ‖b_v^g‖)‖W_O^h‖₂ and ρ = ``_relative``(κ_VO, h·k); norms the
    larger of before and after, κ = max_h σ_1/σ_k of the product. Residual the largest ratio,
    tolerance 1. Control ("singular", a near miss): R1's singular values
    ``SINGULAR_NEAR_MISS`` relative too large, substituted for ``convert.points.nearest``;
    ("heads"): query head h paired with key/value head h mod g, substituted for
    ``convert.per_query`` (only the grouped cases run)."""
    import torch

    from torch_port import convert
    from torch_port.convert import points

    if control == "singular":
        patch = substituted(points, "nearest", _singular_values_stretched(points.nearest))
        cases = [(h, g, geo, False) for h, g in HEADS for geo in EXACT]
        cases += [(h, h, geo, True) for h, _ in HEADS[:1] for geo in EXACT]
    else:
        patch = substituted(convert, "per_query", _heads_modulo(convert.per_query))
        cases = [(h, g, geo, False) for h, g in HEADS if g < h for geo in EXACT]
    gen = torch.Generator().manual_seed(ctx.seed)
    x = torch.randn(TOKENS, CONVERT_D, generator=gen, dtype=torch.float64)
    xn = np.linalg.norm(x.numpy(), axis=1)
    worst, where = 0.0, ""
    with patch if wrong else contextlib.nullcontext(), torch.no_grad():
        for heads, kv, geometry, fused in cases:
            target = (
                fused_module(ctx.seed, heads) if fused else separate_module(ctx.seed, heads, kv)
            )
            module = FusedView(target) if fused else target
            p = heads // kv
            logits, values = maps(module, x, heads, kv)
            before = factors(module, heads, kv)
            biases = {r: getattr(module, f"{r}_proj").bias.detach().numpy() for r in "qkv"}
            convert.riemannian_attention(target, geometry, geometry)
            logits2, values2 = maps(module, x, heads, kv)
            after = factors(module, heads, kv)
            size = {r: np.maximum(_sizes(before)[r], _sizes(after)[r]) for r in before}
            bn = {r: np.linalg.norm(biases[r].reshape(-1, CONVERT_K), axis=1) for r in biases}
            kq, kv_ = np.repeat(size["k"], p), np.repeat(bn["k"], p)
            m_l = np.einsum(
                "hi,hj->hij",
                np.outer(size["q"], xn) + bn["q"][:, None],
                np.outer(kq, xn) + kv_[:, None],
            )
            rho = _relative(_condition(before["q"], before["k"], p), CONVERT_K)
            dl = (logits2 - logits).abs().numpy()
            vsize = np.outer(np.repeat(size["v"], p), xn) + np.repeat(bn["v"], p)[:, None]
            m_z = (vsize * size["o"][:, None]).sum(axis=0)
            rho_z = _relative(_condition(before["o"], before["v"], p), heads * CONVERT_K)
            dz = np.linalg.norm((values2 - values).numpy(), axis=1)
            ratio = max(float((dl / (rho * m_l)).max()), float((dz / (rho_z * m_z)).max()))
            if ratio > worst or math.isnan(ratio):
                layout = ", fused c_attn" if fused else ""
                worst, where = ratio, f"{geometry}, {heads} heads over {kv}{layout}"
    return Outcome.bound(
        worst,
        1.0,
        f"max |ΔL|/(ρM) and ‖ΔZ‖/(ρM) = {worst:.3g} ({where})",
        {
            "sizes": f"d = {CONVERT_D}, k = {CONVERT_K}, {TOKENS} tokens",
            "cases": "; ".join(
                f"{g} at {h}/{k} heads{', fused c_attn' if f else ''}" for h, k, g, f in cases
            ),
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def heads_resolution(ctx: Context, wrong: bool) -> Outcome:
    """``exact_conversion`` on the grouped cases, whose control pairs query head h with key
    and value head h mod g instead of h // p."""
    return exact_conversion(ctx, wrong, control="heads")


def _qr_for_polar(original: Callable) -> Callable:
    """``convert.points.frames`` taking the sign-fixed QR factor of W instead of its polar one."""
    from torch_port import linalg

    return lambda t, init, generator: linalg.qr_signfixed(t)[0]


def _nearest_isometry(m: np.ndarray) -> tuple[np.ndarray, float]:
    """U_k V_kᵀ of NumPy's SVD of m (the nearest partial isometry of rank k, and for a d×k m
    its polar factor) and σ_1/σ_k."""
    u, s, vt = np.linalg.svd(m, full_matrices=False)
    k = CONVERT_K
    return u[:, :k] @ vt[:k], float(s[0] / s[k - 1])


#: (geometry, block) of ``nearest_points``: the block Stiefel variant stacks a group's query heads
#: (``convert.points.product_point``'s reshape); P1 is its block variant under GQA by default.
NEAREST_CASES = (("stiefel", False), ("stiefel", True), ("partial_isometry_embedded", None))


def nearest_points(ctx: Context, wrong: bool) -> Outcome:
    """For each (heads, key/value heads) of ``HEADS``: with ``"stiefel"`` on QK, every query and
    key head's frame the module reads equals U Vᵀ of NumPy's SVD of the head's weight (with
    ``block=True``, each group's query heads stacked, (p·d)×k, against the SVD of the group's
    stacked weights); with
    ``"partial_isometry_embedded"`` on QK (its block variant under GQA), every head's product
    W_Q^h W_K^gᵀ the module reads equals U_k V_kᵀ of NumPy's SVD of the product before (of each
    group's stacked products, for the block variant). Bound: 2κ·``frame_error``(m, k, κ), κ =
    σ_1/σ_k of the matrix, m its rows (each route's forward error, as PORT-5's polar routes).
    Residual the largest ratio, tolerance 1. Control: the QR factor taken for the polar one,
    substituted for ``convert.points.frames``."""
    import torch

    from torch_port import convert
    from torch_port.convert import points

    patch = substituted(points, "frames", _qr_for_polar(points.frames))
    worst, where = 0.0, ""
    with patch if wrong else contextlib.nullcontext(), torch.no_grad():
        for heads, kv in HEADS:
            p = heads // kv
            for geometry, block in NEAREST_CASES:
                module = separate_module(ctx.seed, heads, kv)
                before = factors(module, heads, kv)
                convert.riemannian_attention(module, geometry, block=block)
                after = factors(module, heads, kv)
                if geometry == "stiefel":
                    groups = kv if block else heads
                    size = heads // groups
                    stacked = [
                        (np.vstack(before["q"][j * size : (j + 1) * size]), got)
                        for j, got in enumerate(
                            np.split(np.vstack(after["q"]), groups)  # each group's rows
                        )
                    ]
                    pairs = stacked + list(zip(before["k"], after["k"], strict=True))
                else:
                    products = after["q"] @ np.repeat(after["k"], p, axis=0).transpose(0, 2, 1)
                    pairs = [
                        (
                            np.vstack(list(before["q"][j * p : (j + 1) * p])) @ before["k"][j].T,
                            np.vstack(list(products[j * p : (j + 1) * p])),
                        )
                        for j in range(kv)
                    ]
                for old, got in pairs:
                    want, kappa = _nearest_isometry(old)
                    bound = 2 * kappa * frame_error(old.shape[0], CONVERT_K, kappa=kappa)
                    ratio = float(np.linalg.norm(got - want)) / bound
                    if ratio > worst or math.isnan(ratio):
                        name = f"{geometry}{', block' if block else ''}"
                        worst, where = ratio, f"{name}, {heads} heads over {kv}"
    return Outcome.bound(
        worst,
        1.0,
        f"max ‖X − U_k V_kᵀ‖_F/(2κ·frame_error) = {worst:.3g} ({where})",
        {
            "sizes": f"d = {CONVERT_D}, k = {CONVERT_K}",
            "cases": "stiefel (plain and block) and partial_isometry_embedded on QK at "
            + ", ".join(f"{h}/{g} heads" for h, g in HEADS),
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


#: The near miss of ``reported_change``: the reported change this much relative too large.
CHANGE_NEAR_MISS = 1e-9


def _change_stretched(original: Callable) -> Callable:
    return lambda *args: original(*args) * (1.0 + CHANGE_NEAR_MISS)


def reported_change(ctx: Context, wrong: bool) -> Outcome:
    """The change a conversion reports, ``qk_change`` = max_h ‖M'_h − M_h‖₂/‖M_h‖₂ of the
    products M_h = W_Q^h W_K^{h//p}ᵀ before and after, against the same quantity formed here
    from the module's weights by NumPy (the products written out, their SVDs), for P1 on QK (a
    nearest point: a change of order 1) and R1 (exact: a change at rounding level), at each
    head count of ``HEADS``; and the geometry it reports is the one asked for, its block
    variant under GQA only (else the residual is ∞). Bound per head: both routes form the
    products with inner dimension ≤ 2k and take backward-stable factorisations of d-row
    matrices, so each errs in ‖ΔM‖ by at most E = (γ_{2k} + 4d·u)(‖A'‖_F‖B'‖_F + ‖A‖_F‖B‖_F)
    and in ‖M‖ by d·u relative: |c_reported − c| ≤ 2(2E/‖M‖ + 2d·u·c). Residual the largest
    ratio, tolerance 1. Control, a near miss: the reported change ``CHANGE_NEAR_MISS`` relative
    too large, substituted for ``convert.points.change``."""
    import torch

    from torch_port import convert

    d, k = CONVERT_D, CONVERT_K
    worst, where = 0.0, ""
    patch = substituted(convert, "change", _change_stretched(convert.change))
    with patch if wrong else contextlib.nullcontext(), torch.no_grad():
        for heads, kv in HEADS:
            p = heads // kv
            for geometry in ("partial_isometry_embedded", "fixed_rank_embedded"):
                module = separate_module(ctx.seed, heads, kv)
                before = factors(module, heads, kv)
                (conversion,) = convert.riemannian_attention(module, geometry)
                after = factors(module, heads, kv)
                a, b = before["q"], np.repeat(before["k"], p, axis=0)
                a2, b2 = after["q"], np.repeat(after["k"], p, axis=0)
                m, m2 = a @ b.transpose(0, 2, 1), a2 @ b2.transpose(0, 2, 1)
                norm = np.linalg.norm(m, ord=2, axis=(1, 2))
                c = np.linalg.norm(m2 - m, ord=2, axis=(1, 2)) / norm
                sizes = np.linalg.norm(a2, axis=(1, 2)) * np.linalg.norm(b2, axis=(1, 2))
                sizes += np.linalg.norm(a, axis=(1, 2)) * np.linalg.norm(b, axis=(1, 2))
                e = (gamma(2 * k) + 4 * d * FLOAT64_U) * sizes
                bound = float(np.max(2 * (2 * e / norm + 2 * d * FLOAT64_U * c)))
                ratio = abs(conversion.qk_change - float(c.max())) / bound
                resolved = geometry if kv == heads else f"block_{geometry}"
                if conversion.qk_geometry != resolved:  # the name a reader is told
                    ratio = math.inf
                if ratio > worst or math.isnan(ratio):
                    worst, where = ratio, f"{geometry}, {heads} heads over {kv}"
    return Outcome.bound(
        worst,
        1.0,
        f"max |c_reported − c|/bound = {worst:.3g} ({where})",
        {
            "sizes": f"d = {CONVERT_D}, k = {CONVERT_K}",
            "cases": "partial_isometry_embedded and fixed_rank_embedded on QK at "
            + ", ".join(f"{h}/{g} heads" for h, g in HEADS),
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


def _core_transposed(original: Callable) -> Callable:
    """``convert.weights.with_core`` multiplying by each R1 core's transpose."""
    return lambda heads, cores: original(heads, cores.mT)


def factors_read(ctx: Context, wrong: bool) -> Outcome:
    """A plain module (4 heads) converted with R1 on QK and VO, its stored points then set to
    random points of R1 (U, V sign-fixed QR frames, a non-symmetric core S = I + 0.3·N): each
    head's W_Q^h W_K^hᵀ and A_h W_V^hᵀ as the module reads them (its assembled projections)
    equals ``reference`` R1's ``to_matrix``(U_h, S_h, V_h) entrywise within 4γ_k·|U||S||V|ᵀ (two
    products of inner dimension k, each formed once by the port and once by NumPy). Residual
    the largest ratio, tolerance 1. Control: every core transposed, substituted for
    ``convert.weights.with_core``."""
    import torch

    import reference as ref
    from torch_port import convert
    from torch_port.convert import weights

    heads, k, d = HEADS[0][0], CONVERT_K, CONVERT_D
    rng = np.random.default_rng(ctx.seed)
    r1 = ref.GEOMETRIES["fixed_rank_embedded"](d, d, k)
    module = separate_module(ctx.seed, heads, heads)
    convert.riemannian_attention(module, "fixed_rank_embedded", "fixed_rank_embedded")
    points = {}
    with torch.no_grad():
        for product, spec in module.point_groups.items():
            drawn = []
            for _ in range(heads):
                u, v = (np.linalg.qr(rng.standard_normal((d, k)))[0] for _ in "uv")
                drawn.append((u, np.eye(k) + 0.3 * rng.standard_normal((k, k)), v))
            points[product] = drawn
            for i, name in enumerate(spec["params"]):
                stacked = np.stack([x[i] for x in drawn])
                module.get_parameter(name).copy_(torch.from_numpy(stacked))
    patch = substituted(weights, "with_core", _core_transposed(weights.with_core))
    with patch if wrong else contextlib.nullcontext(), torch.no_grad():
        f = factors(module, heads, heads)
    worst = 0.0
    for product, (row, col) in (("qk", ("q", "k")), ("vo", ("o", "v"))):
        for h, (u, s, v) in enumerate(points[product]):
            got = f[row][h] @ f[col][h].T
            bound = 4 * gamma(k) * (np.abs(u) @ np.abs(s) @ np.abs(v).T)
            ratio = float(np.max(np.abs(got - r1.to_matrix((u, s, v))) / bound))
            worst = max(worst, ratio) if not math.isnan(ratio) else math.inf
    return Outcome.bound(
        worst,
        1.0,
        f"max |W_h − U_h S_h V_hᵀ|/(4γ_k|U||S||V|ᵀ) = {worst:.3g} over QK and VO",
        {
            "sizes": f"d = {d}, k = {k}, {heads} heads",
            "points": "random R1 points, non-symmetric cores",
            "dtypes": "float64",
            "seeds": ctx.seed,
        },
    )


#: PORT-10's rank threshold: the core sizes k tried, and the relative distance from the
#: threshold at which each decision is tested.
RANK_KS, RANK_SIDE = (2, 3, 4), 1e-6


def _threshold_moved(factor: float) -> Callable:
    """``convert.points.rank_tolerance`` times ``factor``."""
    return lambda k: factor * k * np.finfo(np.float64).eps


def rank_threshold(ctx: Context, wrong: bool) -> Outcome:
    """``convert.points.factor_svd`` refuses a product exactly when σ_min/σ_max ≤ k·ε of float64
    (the threshold stated in its docstring, computed here from NumPy's ε): for k in
    ``RANK_KS`` (d = 12), a batch of two heads A = [I_k; 0] and B = [diag(s); 0], whose product
    has the singular values s exactly (the QR factors of both are ±I and ±diag(s)), s_1 = 2⁻¹⁰,
    s_k = 2⁻¹⁰·k·ε·(1 ∓ ``RANK_SIDE``) and the others 2⁻¹¹ (so that σ_min, σ_max, σ_2 and the
    head's k all differ from what a wrong index or shape reads): refused below, accepted above
    (σ_min/σ_max is one division, within half an ulp, 1e-16 of the side). Residual: the
    number of wrong decisions, tolerance 0. Control, near misses: the threshold moved by
    +0.5% and by −0.5% in turn, substituted for ``convert.points.rank_tolerance``; the
    control's residual is the fewest wrong decisions either causes (rejected only if both are
    caught)."""
    import torch

    from torch_port.convert import points

    def wrong_decisions() -> list[str]:
        wrong_calls = []
        for k in RANK_KS:
            threshold = k * np.finfo(np.float64).eps
            for side, refused in ((1 - RANK_SIDE, True), (1 + RANK_SIDE, False)):
                s = torch.full((k,), 2.0**-11, dtype=torch.float64)
                s[0], s[-1] = 2.0**-10, 2.0**-10 * threshold * side
                a = torch.eye(CONVERT_D, k, dtype=torch.float64).expand(2, CONVERT_D, k)
                try:
                    points.factor_svd("PORT-10", a, a * s)
                    decided = False
                except ValueError:
                    decided = True
                if decided != refused:
                    wrong_calls.append(f"k = {k} at {side:g}×threshold")
        return wrong_calls

    if wrong:
        caught = {}
        for factor in (1.005, 0.995):
            with substituted(points, "rank_tolerance", _threshold_moved(factor)):
                caught[factor] = len(wrong_decisions())
        least = min(caught.values())
        return Outcome(
            least == 0, float(least), 0.0, f"wrong decisions per moved threshold: {caught}"
        )
    found = wrong_decisions()
    return Outcome(
        not found,
        float(len(found)),
        0.0,
        f"wrong decisions: {found or 'none'} of {2 * len(RANK_KS)}",
        exercised={
            "sizes": f"d = {CONVERT_D}, k = {', '.join(map(str, RANK_KS))}",
            "cases": f"σ_min/σ_max at 1 ∓ {RANK_SIDE:g} × k·ε",
            "dtypes": "float64",
            "seeds": "none (exact inputs)",
        },
    )


register(
    Proposition(
        id="PORT-10",
        title="Converting a model's attention: exact, nearest, and read as the geometry says",
        statement=(
            r"\texttt{riemannian\_attention} with R1 or R2 on QK and VO (their block variants "
            r"under GQA) keeps every head's logits $L_h(i,j)$ and the value-output $Z(i)$, "
            r"biases included, within $\rho M$ of the model's before ($\rho=8k\kappa u+"
            r"2\gamma_{d+1}+\gamma_{\text{inner}}$, $M$ the product of the two sides' "
            r"norms); with \texttt{stiefel} every head's frame is the polar factor of its "
            r"weight (with \texttt{block=True}, each GQA group's stacked query frames the polar "
            r"factor of the group's stacked weights), and with P1 every head's product is the "
            r"nearest rank-$k$ partial isometry, each within $2\kappa\,\mathrm{frame\_error}$ "
            r"of NumPy's SVD; and the "
            r"converted module's per-head products are R1's $U S V^\top$ of its stored factors. "
            r"A product whose $\sigma_{\min}/\sigma_{\max}\le k\varepsilon$ (float64) is "
            r"refused as of rank below $k$, and one above it is converted; the change a "
            r"conversion reports is $\max_h\|M_h'-M_h\|_2/\|M_h\|_2$ of its products."
        ),
        hypotheses=(
            f"a LLaMA-style module (q/k/v/o projections, q/k/v biases), d = {CONVERT_D}, "
            f"k = {CONVERT_K}, heads {', '.join(f'{h}/{g}' for h, g in HEADS)}; float64",
            "κ = max_h σ_1/σ_k of the product (of the weight, for a frame)",
        ),
        checks=(
            Check(
                "float64",
                "exact conversions keep the logits and the value-output",
                exact_conversion,
                f"near miss: R1's singular values times 1 + {SINGULAR_NEAR_MISS:g}, "
                "substituted into the port",
            ),
            Check(
                "float64",
                "GQA: each query head meets its own group's key and value heads",
                heads_resolution,
                "query head h paired with key/value head h mod g, substituted into the port",
            ),
            Check(
                "float64",
                "the nearest frames and partial isometries against NumPy's SVD",
                nearest_points,
                "the QR factor taken for the polar one, substituted into the port",
            ),
            Check(
                "float64",
                "the module's products are R1's U S Vᵀ of random stored points",
                factors_read,
                "every R1 core transposed where the module assembles its weights, substituted",
            ),
            Check(
                "float64",
                "the change and the geometry a conversion reports",
                reported_change,
                f"near miss: the reported change times 1 + {CHANGE_NEAR_MISS:g}, substituted "
                "into the port",
            ),
            Check(
                "float64",
                "a product of rank below k is refused exactly at σ_min/σ_max ≤ k·ε",
                rank_threshold,
                "near miss: the threshold moved by ±0.5%, substituted into the port",
            ),
        ),
        requires=("torch",),
    )
)
