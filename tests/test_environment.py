"""One environment recorder (``reference.environment.environment``) for certificates and
benchmarks: the same common keys everywhere, callers add their own, never replace the common ones.
"""

from __future__ import annotations

import json
import platform

import pytest

from proofs_checks import bench, certificate
from reference.environment import COMMON_KEYS, LIBRARIES, environment


def test_common_keys_and_versions() -> None:
    env = environment()
    assert tuple(env) == COMMON_KEYS
    assert env["python"] == platform.python_version() and env["platform"]
    assert set(env["versions"]) == set(LIBRARIES)
    assert env["versions"]["numpy"] and env["versions"]["mpmath"]
    assert env["cpu_count"] is None or env["cpu_count"] >= 1
    json.dumps(env)  # JSON as it stands


def test_callers_add_libraries_and_keys_but_never_replace_common_ones() -> None:
    env = environment("surely-not-a-distribution", device="cpu", threads=2)
    assert env["versions"]["surely-not-a-distribution"] is None
    assert env["device"] == "cpu" and env["threads"] == 2
    assert set(COMMON_KEYS) <= set(env)
    with pytest.raises(ValueError, match="python"):
        environment(python="2.7")


def test_certificate_uses_the_one_recorder() -> None:
    assert certificate.environment is environment
    env = certificate.Certificate([], seed=0, quick=True).environment
    # the keys certificates have always had
    assert {"python", "platform", "machine", "versions", "git_commit", "created"} <= set(env)
    assert set(env["versions"]) >= {"numpy", "scipy", "mpmath", "sympy"}


def test_bench_adds_machine_keys_to_it() -> None:
    env = bench.machine_environment("pymanopt")
    assert set(COMMON_KEYS) <= set(env)
    assert {"cpu_model", "blas", "env"} <= set(env) and "pymanopt" in env["versions"]
    json.dumps(env)
