"""The registered propositions; importing this package registers them all."""

from proofs_checks.propositions import (  # noqa: F401  (imported for registration)
    ra1_steepest_descent,
)
