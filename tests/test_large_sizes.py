"""Large sizes: every geometry of ``reference.GEOMETRIES`` runs at m = n = 20000, r = 4 in a child
process whose address space is capped at LIMIT_BYTES, below the size of one formed 20000×20000
float64 matrix (3.2e9 bytes).

DESIGN §4: no method of a factored geometry may form an m×n matrix except the checks-only
``to_matrix``/``tangent_to_matrix``/``egrad_from_matrix``, and each call costs O((m+n)r² + r³).
Here the factors are 20000×4 (160 kB; the block variants stack two query heads over one key factor,
so their group is 40000×20000 and its row factor 40000×4), so a run that stays under the cap can
have formed no m×n matrix, or anything of that order. A second test shows that the cap bites: the
same child allocating one 20000×20000 array fails with MemoryError.

The child sets OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = 1 (in its environment, before NumPy is
imported) so that per-thread BLAS buffers do not count against the cap, and sets the cap with
``resource.setrlimit(resource.RLIMIT_AS, ...)`` before importing NumPy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import reference as ref

resource = pytest.importorskip("resource")  # POSIX only

#: The address-space cap of the child: 3 GB (3·10⁹ bytes), less than the 3.2·10⁹ bytes of one
#: 20000×20000 float64 matrix even before counting the interpreter and its libraries (~0.2 GB).
LIMIT_BYTES = 3_000_000_000
SIZE, RANK = 20000, 4
ROOT = Path(__file__).resolve().parents[1]

_PRELUDE = textwrap.dedent(
    f"""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, ({LIMIT_BYTES}, {LIMIT_BYTES}))
    import numpy as np
    """
)

_GEOMETRY_RUN = textwrap.dedent(
    f"""
    import reference as ref
    from reference.geometry import like, parts, tree_map

    for name in ref.GEOMETRIES:
        rng = np.random.default_rng(0)
        geo = ref.GEOMETRIES[name]({SIZE}, {SIZE}, {RANK})
        x = geo.random_point(rng)
        geo.check_point(x)
        t = geo.random_tangent(x, rng)
        g = like(x, [rng.standard_normal(np.shape(p)) for p in parts(x)])
        rgrad = geo.egrad_to_rgrad(x, g)
        nrm = geo.norm(x, rgrad)
        y = geo.retract(x, tree_map(lambda p: 0.01 * p / nrm, rgrad))
        geo.check_point(y)
        moved = geo.transport(x, y, t)
        assert np.isfinite(geo.norm(y, moved))
        shapes = sorted({{np.shape(p) for p in parts(x)}})
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"ok {{name}} factor shapes {{shapes}} peak RSS {{peak:.0f}} MiB", flush=True)
    """
)


def _child(code: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE + code],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=ROOT,
        timeout=600,
    )


def test_every_geometry_runs_at_20000_under_a_3gb_address_space() -> None:
    out = _child(_GEOMETRY_RUN)
    done = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("ok ")]
    assert out.returncode == 0 and done == list(ref.GEOMETRIES), (
        f"child exit status {out.returncode}; succeeded: {done}\n"
        f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    )


def test_the_cap_bites_on_one_formed_matrix() -> None:
    out = _child(
        f"try:\n    np.ones(({SIZE}, {SIZE}))\nexcept MemoryError:\n    print('MemoryError')\n"
    )
    assert out.returncode == 0 and out.stdout.strip() == "MemoryError", (
        f"child exit status {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    )
