"""``rattn verify CERT.json``: the certificate's ids re-run with its seed on the installed code;
exit 0 when every result and both hashes match, 1 when one does not, 2 for a bad file."""

from __future__ import annotations

import json

from proofs_checks.cli import main

IDS = ["RA-7", "EB-3"]


def _certificate(tmp_path) -> dict:
    assert main(["certify", *IDS, "--quick", "--seed", "3", "--out", str(tmp_path / "c")]) == 0
    return json.loads((tmp_path / "c" / "certificate.json").read_text())


def _write(tmp_path, doc) -> str:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_an_unchanged_certificate_matches(tmp_path, capsys) -> None:
    _certificate(tmp_path)
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "c" / "certificate.json"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["matches"] and doc["seed"] == 3 and doc["quick"] is True
    assert [p["id"] for p in doc["propositions"]] == IDS
    assert all(p["hash_matches"] and p["implementation_hash_matches"] for p in doc["propositions"])
    assert doc["recorded_source_hash"] == doc["source_hash"]


def test_a_changed_hash_result_or_id_does_not_match(tmp_path, capsys) -> None:
    doc = _certificate(tmp_path)
    for edit, pid in (
        (lambda d: d["propositions"][0].update(hash="0" * 64), "RA-7"),
        (lambda d: d["propositions"][1].update(implementation_hash="0" * 64), "EB-3"),
        (lambda d: d["propositions"][1].update(passed=False), "EB-3"),
        (lambda d: d["propositions"][0].update(id="RA-99"), "RA-99"),
    ):
        edited = json.loads(json.dumps(doc))
        edit(edited)
        capsys.readouterr()
        assert main(["verify", _write(tmp_path, edited), "--json"]) == 1
        rows = {p["id"]: p for p in json.loads(capsys.readouterr().out)["propositions"]}
        assert not rows[pid]["match"]
        assert all(p["match"] for i, p in rows.items() if i != pid)


def test_a_file_that_is_not_a_certificate_exits_2(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.json"
    for text, message in (
        ("{not json", "not a readable certificate"),
        ("[1, 2]", "a JSON object is expected"),
        ('{"seed": -1, "quick": true, "propositions": [{"id": "RA-7", "passed": true}]}', "seed"),
        ('{"seed": 0, "quick": true, "propositions": []}', "lists no proposition"),
    ):
        bad.write_text(text)
        assert main(["verify", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "bad.json" in err and message in err
    assert main(["verify", str(tmp_path / "missing.json")]) == 2
