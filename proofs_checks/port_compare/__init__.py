"""The port against the reference: seeded problems run through ``reference.optim`` (float64,
NumPy) and ``torch_port.optim`` (a chosen device and dtype), step by step, for every geometry
(DESIGN §7; ``rattn compare``). ``RECORDS`` is the table of cases (geometry, problem, rule,
dtypes, steps); ``tests/test_port_agreement.py`` runs the same table.

This is validation code: it imports ``reference`` (DESIGN §2 allows it here; the core modules of
``torch_port`` never do).

What is compared. For a problem (a loss on the parameters of one group: frames, each parameter a
batch (..., d, r), or the factors of one batched point of the ten), a rule and a dtype, both sides
start from the same float64 points (the port's rounded to its dtype) and take ``steps`` steps.
The reference treats every element of the batch as its own point with its own optimizer state
(the Euclidean gradient computed in NumPy); the port holds the parameters as batched tensors in
one parameter group of the geometry (gradient by autograd, in the dtype, on the device). After
every step the port's points are read back in float64 and compared element by element
(``geometries``: the point itself, or W = A Bᵀ for the quotients):

- ``max_deviation``: max over steps and elements of ‖x_port − x_ref‖_F;
- ``final_drift``: max over elements and orthonormal factors F of ‖FᵀF − I‖_F of the port's last
  point, measured in float64 from its stored entries.

Bounds (``deviation_bound``, ``drift_bound``; derivations in ``BOUND_NOTES`` and in
docs/torch_port.md). u_w is the unit roundoff of the dtype (float64 2^-53 ≈ 1.1e-16, float32
2^-24 ≈ 6.0e-8, bfloat16 2^-8 ≈ 3.9e-3), u that of float64.

- Deviation: each step of the port differs from the exact step from the same point by a local
  error of at most C·u_w·s (C = ``LOCAL_ERROR_ULPS`` = 90: O(d·r) products and sums of length
  ≤ d, one r×r eigendecomposition, the rounding of the new point; for float64 this is the 1e-14
  per step of the agreement tests; s = max(1, ‖W‖_F/sqrt(r)) the size of the points along the
  reference trajectory, 1 for a frame). Errors made at step k are carried to step N by the
  linearised trajectory map; its amplification is measured, not assumed: ``amplification`` S is
  max_t ‖Δx_t‖/‖Δx_0‖ for a reference run started 1e-7 away (float64, same rule). First-order
  propagation then gives ‖x_port − x_ref‖ ≤ max(1, S)·(e_0 + N·C·u_w·s), e_0 the initial
  rounding (0 in float64). In float64 with S ≤ 1 this is 1e-14 per step, 1e-12 after 100 steps
  (DESIGN §7). The bound is a priori only where it is informative: when it reaches the diameter
  of the frame set (2·sqrt(r): any two frames are that close), it says nothing, and a
  **measured envelope** (``ENVELOPES``, set from runs over seeds 0–9 with a factor of about 3
  and stated as such) is used instead; the case is then marked "envelope".
- Drift: a retraction that ends in the polar factor re-forms the Gram of the stored factor at
  every step, so rounding does not accumulate across steps; the last step leaves
  ‖FᵀF − I‖ ≤ 4r(r + 1)u_w + 2(d + r)r·u per d×r orthonormal factor (the d×r product A·S with
  inner length r and the cast of S = (AᵀA)^{-1/2} to the dtype, plus the float64 Gram and
  eigendecomposition; a factor 2 for second-order terms). Other retractions report the drift
  without a bound.

Adding a geometry: give it an adapter in ``GEOMETRY_ADAPTERS`` (``geometries``: how the port's
parameters become the reference's points and back, what is compared, the residual and its
bound), problems with ``register_problem`` and rows in ``RECORDS``; the runner and the CLI pick
them up by name.
"""

from proofs_checks.port_compare import problems, rules
from proofs_checks.port_compare.geometries import (
    GEOMETRY_ADAPTERS,
    FrameAdapter,
    PointAdapter,
    unit_roundoff,
)
from proofs_checks.port_compare.problems import (
    PROBLEMS,
    VARIANTS,
    Instance,
    Problem,
    register_problem,
)
from proofs_checks.port_compare.rules import RECORDS, RULES, Record, Rule
from proofs_checks.port_compare.runner import (
    BOUND_NOTES,
    DTYPES,
    ENVELOPES,
    QUICK_STEPS,
    ReferenceRun,
    amplification,
    check_device,
    compare,
    format_table,
    parse_dtypes,
    port_trajectory,
    records,
    reference_trajectory,
    run_case,
    select,
)

__all__ = [
    "BOUND_NOTES",
    "DTYPES",
    "ENVELOPES",
    "GEOMETRY_ADAPTERS",
    "PROBLEMS",
    "QUICK_STEPS",
    "RECORDS",
    "RULES",
    "VARIANTS",
    "FrameAdapter",
    "Instance",
    "PointAdapter",
    "Problem",
    "Record",
    "ReferenceRun",
    "Rule",
    "amplification",
    "check_device",
    "compare",
    "format_table",
    "parse_dtypes",
    "port_trajectory",
    "problems",
    "records",
    "reference_trajectory",
    "register_problem",
    "rules",
    "run_case",
    "select",
    "unit_roundoff",
]
