"""Propositions about the reference as registered, citable objects, and the certificate runner."""

from proofs_checks import propositions as _propositions  # noqa: F401  (registers them)
from proofs_checks.certificate import Certificate, certify
from proofs_checks.registry import REGISTRY, Check, Context, Outcome, Proposition

__all__ = ["REGISTRY", "Certificate", "Check", "Context", "Outcome", "Proposition", "certify"]
