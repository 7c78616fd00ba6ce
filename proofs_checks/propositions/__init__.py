"""The registered propositions; importing this package registers them all."""

from proofs_checks.propositions import (  # noqa: F401  (imported for registration)
    ra1_steepest_descent,
    ra2_scale_independence,
    ra3_conditioning,
    ra4_equivariance,
    ra5_decay,
    ra6_gauge,
    ra7_degree,
)
