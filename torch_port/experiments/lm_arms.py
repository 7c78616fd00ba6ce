"""The arms of the lm sweep and the model each one trains: which products of the attention lie on
which geometry, the causal byte-level transformer built for an arm, and the arms a
configuration asks for or the attention module refuses (a plain base geometry under GQA).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch_port.experiments.models import TokenEmbedding, Transformer
from torch_port.geometries import GEOMETRIES, PLAIN

VOCAB = 256

#: The ten design points of DESIGN §4.5 (every name of GEOMETRIES except "stiefel").
TEN_GEOMETRIES: tuple[str, ...] = tuple(g for g in GEOMETRIES if g != "stiefel")
#: Every arm, in reporting order.
ALL_ARMS: tuple[str, ...] = ("adamw", "stiefel", *TEN_GEOMETRIES)

#: The attention module's refusal of a plain base geometry under GQA (a recorded skip).
GQA_REFUSAL = "one key/value head per query head"


def attention_options(arm: str, products: str = "qk") -> dict[str, Any]:
    """Keyword arguments of ``models.Transformer`` for ``arm``: the QK geometry (``arm`` for
    ``products`` "qk" and "qkvo", else None), the VO geometry (``arm`` for "vo" and "qkvo", else
    None; both None for AdamW) and ``block`` for the ``block_`` design points."""
    if arm == "adamw":
        return {"qk_geometry": None, "vo_geometry": None, "block": False}
    if arm not in ALL_ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose from {list(ALL_ARMS)}")
    qk = arm if products in ("qk", "qkvo") else None
    vo = arm if products in ("vo", "qkvo") else None
    return {"qk_geometry": qk, "vo_geometry": vo, "block": arm.startswith("block_")}


def kv_heads(config: Mapping[str, Any], name: str) -> int:
    """Key/value heads of attention configuration ``name`` ("mha" or "gqa")."""
    if name == "mha":
        return int(config["n_heads"])
    if name == "gqa":
        return int(config["gqa_kv_heads"])
    raise ValueError(f"unknown attention configuration {name!r}; choose mha or gqa")


def build_model(config: Mapping[str, Any], name: str, arm: str, seed: int) -> Transformer:
    """The causal byte-level transformer of one arm (paired initialisation from ``seed``)."""
    d = int(config["d_model"])
    return Transformer(
        TokenEmbedding(VOCAB, d),
        d,
        int(config["n_layers"]),
        int(config["n_heads"]),
        int(config["d_mlp"]),
        VOCAB,
        int(config["context"]),
        seed=seed,
        n_kv_heads=kv_heads(config, name),
        causal=True,
        **attention_options(arm, config["products"]),
    )


def arm_refusal(config: Mapping[str, Any], name: str, arm: str) -> str | None:
    """The attention module's refusal message when ``arm`` is a plain base geometry and
    configuration ``name`` has fewer key/value heads than query heads (each head's QK product
    is its own point, which needs a one-to-one head pattern: a known, recorded skip); None when
    the model builds. Any other error building the model propagates (a bad setting, not a skip)."""
    if arm in PLAIN and kv_heads(config, name) < int(config["n_heads"]):
        try:
            build_model(config, name, arm, 0)
        except ValueError as exc:
            if GQA_REFUSAL not in str(exc):
                raise
            return str(exc)
        return None
    build_model(config, name, arm, 0)
    return None


def resolve_arms(config: Mapping[str, Any]) -> list[str]:
    """The arms asked for: ``"all"`` or a list of names from ``ALL_ARMS``."""
    arms = config["arms"]
    if arms == "all":
        return list(ALL_ARMS)
    if isinstance(arms, str) or not isinstance(arms, Sequence) or not arms:
        raise ValueError(f"arms must be 'all' or a non-empty list of names, got {arms!r}")
    unknown = [a for a in arms if a not in ALL_ARMS]
    if unknown:
        raise ValueError(f"unknown arms {unknown}; choose from {list(ALL_ARMS)}")
    return list(dict.fromkeys(arms))
