"""The rattn command line: exit statuses, --json, --list and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from proofs_checks.cli import main


def test_certify_json_prints_one_document(tmp_path, capsys) -> None:
    assert main(["certify", "RA-6", "--quick", "--json", "--out", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] and [p["id"] for p in doc["propositions"]] == ["RA-6"]


def test_list(capsys) -> None:
    assert main(["certify", "--list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows][:2] == ["RA-1", "RA-2"]


def test_unknown_id_is_bad_input(capsys) -> None:
    assert main(["certify", "RA-42"]) == 2
    err = capsys.readouterr().err
    assert "unknown proposition id(s): RA-42" in err and "Traceback" not in err


def test_bad_usage_exits_2(capsys) -> None:
    assert main(["frobnicate"]) == 2
    assert main(["certify", "--seed", "x"]) == 2
    assert main(["bench", "stiefel", "--d", "3", "--r", "5"]) == 2
    assert "r ≤ d" in capsys.readouterr().err


def test_module_entry_point_is_certify(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "proofs_checks", "--list"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert out.returncode == 0 and out.stdout.startswith("RA-1")
    bad = subprocess.run(
        [sys.executable, "-m", "proofs_checks", "NOPE"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_bench_stiefel_small(capsys) -> None:
    assert main(["bench", "stiefel", "--d", "16", "--r", "4", "--repeats", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [row["name"] for row in doc["rows"]]
    assert any("Gram" in n for n in names) and any("SVD" in n for n in names)


def test_geometries_lists_the_ten_and_stiefel(capsys) -> None:
    assert main(["geometries", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 11 and rows[0]["name"] == "stiefel"
    second = [r for r in rows if r["retraction_order"] == 2]
    assert all(r["measured_slope"] >= 2.9 for r in second)
    assert main(["geometries", "--r", "9"]) == 2


def test_certify_from_the_command_line(tmp_path, capsys) -> None:
    """Ids in any case through the CLI (every id runs by default in test_certificate's
    ``refereed``, and through the CLI with ``-m slow``)."""
    assert main(["certify", "geo-BLOCK_stiefel_pair", "ra-1", "--quick", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] and [p["id"] for p in doc["propositions"]] == [
        "RA-1",
        "GEO-block_stiefel_pair",
    ]


@pytest.mark.slow
def test_certify_everything_from_the_command_line(tmp_path, capsys) -> None:
    """The README's main job, every id (mixed-case GEO ids included), through the CLI."""
    assert main(["certify", "--quick", "--json", "--out", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] and any(p["id"] == "GEO-block_stiefel_pair" for p in doc["propositions"])
    assert main(["certify", "geo-STIEFEL", "--list"]) == 0


def test_bad_seed_and_output_are_bad_input(tmp_path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["certify", "RA-1", "--out", str(blocker)]) == 2
    assert main(["certify", "RA-1", "--seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert "cannot write certificates" in err and "--seed must be ≥ 0" in err


def test_bench_geometries_small(capsys) -> None:
    assert (
        main(
            ["bench", "geometries", "--m", "8", "--n", "6", "--r", "2", "--repeats", "2", "--json"]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert {"fixed_rank_embedded", "block_stiefel_pair"} <= {row["name"] for row in doc["rows"]}
