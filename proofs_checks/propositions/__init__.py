"""The registered propositions; importing this package registers them, in citation order."""

# ruff: noqa: I001, F401  (the import order is the registry's order; imported for registration)
from proofs_checks.propositions import ra1_steepest_descent
from proofs_checks.propositions import ra2_scale_independence
from proofs_checks.propositions import ra3_conditioning
from proofs_checks.propositions import ra4_equivariance
from proofs_checks.propositions import ra5_decay
from proofs_checks.propositions import ra6_gauge
from proofs_checks.propositions import ra7_degree
from proofs_checks.propositions import geo
from proofs_checks.propositions import eb_static
from proofs_checks.propositions import eb_recovery
from proofs_checks.propositions import eb_data
from proofs_checks.propositions import eb_exchangeability
from proofs_checks.propositions import eb_native
from proofs_checks.propositions import eb_pooled
from proofs_checks.propositions import eb_softmax
from proofs_checks.propositions import ref_adam
from proofs_checks.propositions import ref_rules
from proofs_checks.propositions import port
from proofs_checks.propositions import port_drift
from proofs_checks.propositions import port_capturable
from proofs_checks.propositions import port_ends
from proofs_checks.propositions import port_geometry
from proofs_checks.propositions import port_plumbing
from proofs_checks.propositions import port_skips
from proofs_checks.propositions import port_state
from proofs_checks.propositions import port_sharding
from proofs_checks.propositions import port_refusals
from proofs_checks.propositions import port_convert
