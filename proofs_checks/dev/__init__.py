"""Tools for developing the project, not installed with it: mutation testing (``mutation``) and
the tracer of the call map the implementation hashes read (``call_trace``). They run from a
checkout (``python -m proofs_checks.dev.mutation``, ``python proofs_checks/dev/call_trace.py``)."""
