"""The PyTorch mirror of ``reference`` for GPU training (DESIGN §7).

Its core modules import torch only; they never import ``reference`` or ``proofs_checks``.
"""
