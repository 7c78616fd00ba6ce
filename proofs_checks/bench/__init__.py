"""Timing benchmarks of the reference geometries and the torch port (``rattn bench NAME``).

- ``timing``: the shared machinery: calls per sample, interleaved rounds, median and IQR, and the
  record of the machine (``machine_environment``: ``reference.environment.environment`` plus
  CPU model, BLAS and thread variables);
- ``peers``: pymanopt and geoopt, imported only when asked, never failing a benchmark;
- ``stiefel``: ``bench_stiefel``, ``format_bench`` (projection and retractions of St(d, r));
- ``geometries``: ``bench_geometries``, ``format_geometries`` (one step of each of the ten);
- ``port``: ``bench_port``, ``format_port`` (the port's optimizer step; torch imported lazily);
- ``profile``: where one port step spends its time (``port_attribution``);
- ``model``: ``bench_model``, ``format_model`` (a whole model's step against AdamW);
- ``train``: ``bench_train``, ``format_train`` (a whole training step: forward, backward, step);
- ``audit``: ``bench_audit`` (the recorder's overhead).

Every name below stays importable from ``proofs_checks.bench``.
"""

from proofs_checks.bench.geometries import (
    AGREEMENT_MAX_ENTRIES,
    PYMANOPT_FIXED_RANK_ROW,
    R1,
    R1_SAME_INPUT_ROW,
    SCALING_GEOMETRIES,
    SCALING_SIZES,
    STEP_SCALE,
    bench_geometries,
    format_geometries,
    geometries_bytes,
)
from proofs_checks.bench.peers import GEOOPT_MISSING, PYMANOPT_MISSING
from proofs_checks.bench.port import (
    ADAMW_ROW,
    FLOOR_ROW,
    GEOOPT_ROW,
    LINEARITY_ROW,
    PASSES_ROW,
    PORT_LR,
    PORT_ROW,
    PORT_TARGET_STATE,
    PORT_TARGET_VS_ADAMW,
    PORT_TARGET_VS_FLOOR,
    PORT_TARGET_VS_GEOOPT,
    ROUTE_ROW,
    bench_port,
    check_port_sizes,
    format_port,
)
from proofs_checks.bench.profile import PROFILE_TOP
from proofs_checks.bench.stiefel import (
    GRAM_ROW,
    STEP_NORM,
    SVD_ROW,
    TARGET_SPEEDUP,
    bench_stiefel,
    format_bench,
    stiefel_bytes,
)
from proofs_checks.bench.timing import SAMPLE_TARGET_S, machine_environment

__all__ = [
    "ADAMW_ROW",
    "AGREEMENT_MAX_ENTRIES",
    "FLOOR_ROW",
    "GEOOPT_MISSING",
    "GEOOPT_ROW",
    "GRAM_ROW",
    "LINEARITY_ROW",
    "PASSES_ROW",
    "PORT_LR",
    "PORT_ROW",
    "PORT_TARGET_STATE",
    "PORT_TARGET_VS_ADAMW",
    "PORT_TARGET_VS_FLOOR",
    "PORT_TARGET_VS_GEOOPT",
    "PROFILE_TOP",
    "PYMANOPT_FIXED_RANK_ROW",
    "PYMANOPT_MISSING",
    "R1",
    "R1_SAME_INPUT_ROW",
    "ROUTE_ROW",
    "SAMPLE_TARGET_S",
    "SCALING_GEOMETRIES",
    "SCALING_SIZES",
    "STEP_NORM",
    "STEP_SCALE",
    "SVD_ROW",
    "TARGET_SPEEDUP",
    "bench_geometries",
    "bench_port",
    "bench_stiefel",
    "check_port_sizes",
    "format_bench",
    "format_geometries",
    "format_port",
    "geometries_bytes",
    "machine_environment",
    "stiefel_bytes",
]
