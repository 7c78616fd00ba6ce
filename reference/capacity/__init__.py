"""Capacity of token mixing: rank estimators, planted tasks, pre-training estimators, trainers.

This is the float64 reference for the Entropic-Bound propositions (DESIGN §6, EB-1…EB-8; the
reconstruction in ``background/entropic_bound.md``). A sequence is X ∈ ℝ^{n×d} (rows are tokens
x_i), the value map is W_V ∈ ℝ^{d×d_v}, and the output is Y = A·X·W_V + σE with a token-mixing
operator A ∈ ℝ^{n×n}:

- static surrogate: A = A* is an input-independent parameter of rank r*;
- linear QK attention: A(X) = X K Xᵀ / n with K = W_Q W_Kᵀ ∈ ℝ^{d×d};
- softmax attention: A(X) = rowsoftmax(β X K Xᵀ / √d).

Batches of sequences are arrays X of shape (S, n, d) and Y of shape (S, n, d_v). Every public
function validates its input and raises ``ValueError`` naming the problem and the measured value,
except the four algebraic kernels of the trainers (``static_gradient``, ``linear_qk_gradient``,
``quadratic_form``, ``factor_gradients``): they also run on object arrays of exact SymPy numbers
(the symbolic checks of EB-3 and EB-6) and inside the training loops, so they are pure algebra and
say so; their callers (``factorised_gd`` and the ``train_*`` front ends) validate.

Four groups of functions:

1. **Estimators on a spectrum** σ₁ ≥ σ₂ ≥ … ≥ σ_m ≥ 0 (any order is accepted and sorted):
   ``numerical_rank``, ``energy_threshold_rank``, ``energy_effective_rank``, ``roy_vetterli_rank``,
   ``stable_rank``, ``largest_gap_rank`` and its floor for attention ``attention_gap_floor`` (the
   rule of ``rattn rank``); ``estimate_all`` returns all of them. Plus the sequential count of
   token-Gram eigenvalues, ``token_gram_count``, calibrated by the exact null law of its
   statistic, ``largest_root_quantile`` (module ``largest_root``).
2. **Planted tasks** with a known rank r*: ``static_task``, ``linear_qk_task``, ``softmax_task``
   (seeded; flat or decaying spectra; a PSD option for the kernel) and the closed forms of the
   static surrogate (``static_excess_risk``, ``deficiency_bound``, ``truncated_mixer``), of its
   token Gram (``gram_population``) and of the pooled regression (``pooled_population``).
3. **Pre-training estimators** (from data, before any training): ``token_gram`` and
   ``token_gram_count``, ``ols_static_mixer``, ``pooled_regression``, ``first_order_softmax`` and
   ``inversion_estimator``.
4. **Trainers** (EB-3, EB-6): plain gradient descent on factorised students with closed-form
   gradients, ``static_statistics``/``linear_qk_statistics`` (sufficient statistics of the
   empirical risk), ``static_gradient``, ``linear_qk_gradient``, ``quadratic_form``,
   ``factor_gradients``, ``factorised_gd``, ``small_init`` and the front ends
   ``train_static_student`` and ``train_linear_qk_student``. Divergence (a step too large for the
   problem) raises ``ValueError`` naming lr and the step or loss measured; no trainer returns NaN.

The package holds one module per group, imported one way (``validation`` below the other four,
which do not import each other): ``validation`` (input checks shared by all, ``spectrum`` and
``singular_values``), ``largest_root`` (the null law of the token-Gram count, imported by
``spectra``), ``spectra`` (group 1, with the token Gram and its count), ``tasks``
(group 2), ``pretraining`` (group 3) and ``trainers`` (group 4). Above them, ``strength``
(tasks and pretraining) states a planted task's signal strength κ in units of the detection
edge of the operator an estimator reads (``from reference.capacity import strength``). Every
public name of the five group modules is re-exported here, so ``from reference import capacity;
capacity.X`` and ``from reference.capacity import X`` name the same object as
``reference.capacity.<module>.X``.
"""

from reference.capacity.largest_root import largest_root_quantile
from reference.capacity.pretraining import (
    Regression,
    first_order_softmax,
    inversion_estimator,
    noise_edge,
    ols_static_mixer,
    pooled_regression,
)
from reference.capacity.spectra import (
    TRACY_WIDOM_1,
    GramCount,
    attention_gap_floor,
    energy_effective_rank,
    energy_threshold_rank,
    estimate_all,
    largest_gap_rank,
    mp_edge,
    numerical_rank,
    roy_vetterli_rank,
    stable_rank,
    token_gram,
    token_gram_count,
    tracy_widom_threshold,
)
from reference.capacity.tasks import (
    PlantedTask,
    cholesky,
    deficiency_bound,
    gram_population,
    linear_attention_mixing,
    linear_qk_task,
    orthonormal,
    planted_kernel,
    planted_mixer,
    planted_spectrum,
    pooled_population,
    softmax_attention_mixing,
    softmax_task,
    static_excess_risk,
    static_task,
    truncated_mixer,
)
from reference.capacity.trainers import (
    LinearQKStatistics,
    StaticStatistics,
    StudentFit,
    factor_gradients,
    factorised_gd,
    linear_qk_gradient,
    linear_qk_statistics,
    quadratic_form,
    small_init,
    static_gradient,
    static_statistics,
    train_linear_qk_student,
    train_static_student,
)
from reference.capacity.validation import EPS, Array, singular_values, spectrum

__all__ = [
    "EPS",
    "TRACY_WIDOM_1",
    "Array",
    "GramCount",
    "LinearQKStatistics",
    "PlantedTask",
    "Regression",
    "StaticStatistics",
    "StudentFit",
    "attention_gap_floor",
    "cholesky",
    "deficiency_bound",
    "energy_effective_rank",
    "energy_threshold_rank",
    "estimate_all",
    "factor_gradients",
    "factorised_gd",
    "first_order_softmax",
    "gram_population",
    "inversion_estimator",
    "largest_gap_rank",
    "largest_root_quantile",
    "linear_attention_mixing",
    "linear_qk_gradient",
    "linear_qk_statistics",
    "linear_qk_task",
    "mp_edge",
    "noise_edge",
    "numerical_rank",
    "ols_static_mixer",
    "orthonormal",
    "planted_kernel",
    "planted_mixer",
    "planted_spectrum",
    "pooled_population",
    "pooled_regression",
    "quadratic_form",
    "roy_vetterli_rank",
    "singular_values",
    "small_init",
    "softmax_attention_mixing",
    "softmax_task",
    "spectrum",
    "stable_rank",
    "static_excess_risk",
    "static_gradient",
    "static_statistics",
    "static_task",
    "token_gram",
    "token_gram_count",
    "tracy_widom_threshold",
    "train_linear_qk_student",
    "train_static_student",
    "truncated_mixer",
]
