"""Propositions about the reference as registered, citable objects, and the certificate runner."""

from proofs_checks import early_interrupt

early_interrupt.install()  # first: the imports below take seconds (the rattn command only)

from proofs_checks import propositions as _propositions  # noqa: E402, F401  (registers them)
from proofs_checks.certificate import Certificate, certify  # noqa: E402
from proofs_checks.registry import REGISTRY, Check, Context, Outcome, Proposition  # noqa: E402

__all__ = ["REGISTRY", "Certificate", "Check", "Context", "Outcome", "Proposition", "certify"]
