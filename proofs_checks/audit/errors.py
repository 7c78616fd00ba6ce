"""What cannot be replayed: the errors of ``rattn audit``, each naming what is wrong (the
command turns them into exit 2)."""

from __future__ import annotations


class TraceError(ValueError):
    """A trace that cannot be replayed (named, with what is wrong)."""


class MissingState(TraceError):
    """The recorded state lacks an entry the rule needs."""
