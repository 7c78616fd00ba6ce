"""``rattn verify CERT.json``: the certificate's ids re-run with its seed on the installed code and
every field a reader sees compared; exit 0 when all match, 1 when one does not (each difference
named), 2 for a file that is not a certificate or cannot be read safely (one line)."""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proofs_checks import safe_json
from proofs_checks.cli import main
from proofs_checks.registry import REGISTRY
from proofs_checks.safe_json import read_json
from proofs_checks.verify import format_verify, residual_matches, tolerance_matches, verify

IDS = ["RA-7", "EB-3"]
#: RA-7's check measured at 0.26 of its tolerance at seed 3 (degree zero for subnormal
#: gradients): far enough from 0 that the residual rule refuses it as 1e-300.
RA7_SUBNORMAL = [c.name for c in REGISTRY["RA-7"].checks].index(
    "degree zero for subnormal gradients"
)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, Any]:
    """An honest quick certificate of IDS at seed 3, as JSON."""
    out = tmp_path_factory.mktemp("cert") / "c"
    assert main(["certify", *IDS, "--quick", "--seed", "3", "--out", str(out)]) == 0
    return json.loads((out / "certificate.json").read_text(encoding="utf-8"))


def _write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return path


def _prop(doc: dict[str, Any], pid: str) -> dict[str, Any]:
    return next(p for p in doc["propositions"] if p["id"] == pid)


def _every_residual(doc: dict[str, Any]) -> None:
    for p in doc["propositions"]:
        for c in p["checks"]:
            c["residual"] = 1e-300


def _no_control_rejected(doc: dict[str, Any]) -> None:
    for p in doc["propositions"]:
        for c in p["checks"]:
            c["control"]["rejected"] = False


def _bogus_first(doc: dict[str, Any]) -> None:
    bogus = copy.deepcopy(_prop(doc, "RA-7"))
    bogus["passed"] = False
    doc["propositions"].insert(0, bogus)


def _run_as_not_run(doc: dict[str, Any]) -> None:
    eb3 = _prop(doc, "EB-3")
    doc["propositions"].remove(eb3)
    doc["not_run"] = [{"id": "EB-3", "title": eb3["title"], "reason": "needs torch"}]


def _all_control_fields(doc: dict[str, Any]) -> set[tuple[str | None, str]]:
    return {
        (p["id"], f"checks[{k}].control.rejected")
        for p in doc["propositions"]
        for k in range(len(p["checks"]))
    }


#: (name, edit of the honest certificate, the (id, field) differences it must report).
FORGERIES: list[tuple[str, Callable[[dict[str, Any]], None], Any]] = [
    (
        "statement replaced",
        lambda d: _prop(d, "RA-7").update(
            statement="Riemannian Adam converges to the global optimum in one step."
        ),
        {("RA-7", "statement")},
    ),
    ("title changed", lambda d: _prop(d, "RA-7").update(title="Degree"), {("RA-7", "title")}),
    (
        "hypotheses changed",
        lambda d: _prop(d, "RA-7")["hypotheses"].append("none needed"),
        {("RA-7", "hypotheses")},
    ),
    ("seeds changed", lambda d: _prop(d, "EB-3").update(seeds="any"), {("EB-3", "seeds")}),
    ("checks emptied", lambda d: _prop(d, "RA-7").update(checks=[]), {("RA-7", "checks")}),
    (
        "a check renamed",
        lambda d: _prop(d, "EB-3")["checks"][1].update(name="GD recovers r* always"),
        {("EB-3", "checks[1].name")},
    ),
    (
        "a check's kind changed",
        lambda d: _prop(d, "EB-3")["checks"][0].update(kind="mpmath"),
        {("EB-3", "checks[0].kind")},
    ),
    (
        "a tolerance loosened",
        lambda d: _prop(d, "RA-7")["checks"][1].update(tolerance=1.0),
        {("RA-7", "checks[1].tolerance")},
    ),
    (
        "every control not rejected, passed kept",
        _no_control_rejected,
        "every control",  # each check of each proposition (_all_control_fields)
    ),
    (
        "a control's variant changed",
        lambda d: _prop(d, "EB-3")["checks"][1]["control"].update(variant="none"),
        {("EB-3", "checks[1].control.variant")},
    ),
    (
        "a control's residual changed",
        lambda d: _prop(d, "EB-3")["checks"][1]["control"].update(residual=0.5),
        {("EB-3", "checks[1].control.residual")},
    ),
    (
        "top-level passed false",
        lambda d: d.update(passed=False),
        {(None, "passed")},
    ),
    (
        "a proposition failed, top-level passed kept",
        lambda d: _prop(d, "EB-3").update(passed=False),
        {("EB-3", "passed"), (None, "passed")},
    ),
    (
        "what was exercised widened",
        lambda d: _prop(d, "RA-7").update(exercised={"sizes": ["St(4096, 64)"]}),
        {("RA-7", "exercised")},
    ),
    (
        "what a check exercised widened",
        lambda d: _prop(d, "EB-3")["checks"][1].update(exercised={"seeds": "0-999"}),
        {("EB-3", "checks[1].exercised")},
    ),
    ("a changed hash", lambda d: _prop(d, "RA-7").update(hash="0" * 64), {("RA-7", "hash")}),
    (
        "a changed implementation hash",
        lambda d: _prop(d, "EB-3").update(implementation_hash="0" * 64),
        {("EB-3", "implementation_hash")},
    ),
    (
        "an id the registry does not have",
        lambda d: _prop(d, "RA-7").update(id="RA-99"),
        {("RA-99", "passed")},
    ),
    (
        "the package version",
        lambda d: d["environment"]["versions"].update(rattn="9.9.9"),
        {(None, "environment.versions.rattn")},
    ),
    (
        "a failed proposition listed as not run",
        _run_as_not_run,
        {("EB-3", "not_run")},
    ),
]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [pytest.param(edit, expected, id=name) for name, edit, expected in FORGERIES],
)
def test_a_forged_field_is_named(recorded, tmp_path, edit, expected) -> None:
    doc = copy.deepcopy(recorded)
    edit(doc)
    result = verify(_write(tmp_path, doc))
    found = {(d["id"], d["field"]) for d in result["differences"]}
    if expected == "every control":
        expected = _all_control_fields(recorded)
    assert found == expected
    assert result["matches"] is False
    text = format_verify(result)
    assert text.endswith("DOES NOT MATCH")
    for pid, field in expected:
        assert f"- {pid or 'certificate'} {field}: recorded " in text


def test_every_residual_set_to_1e300_is_named(recorded, tmp_path) -> None:
    """A residual more than a factor 2 and more than 1/16 of its tolerance from its re-run is
    named (RA-7's at 0.26 of its tolerance; EB-3's symbolic 0 against a tolerance of 0); EB-3's
    count of 0 failures against a tolerance of 1, recorded as 1e-300, is not (the residual
    rule)."""
    doc = copy.deepcopy(recorded)
    _every_residual(doc)
    result = verify(_write(tmp_path, doc))
    found = {(d["id"], d["field"]) for d in result["differences"]}
    assert ("RA-7", f"checks[{RA7_SUBNORMAL}].residual") in found
    assert all(field.endswith(".residual") for _, field in found)
    assert ("EB-3", "checks[0].residual") in found
    assert ("EB-3", "checks[1].residual") not in found
    row = next(
        d for d in result["differences"] if d["field"] == f"checks[{RA7_SUBNORMAL}].residual"
    )
    assert row["recorded"] == 1e-300 and row["here"] > 1 / 16
    assert not result["matches"]


def test_a_duplicate_id_is_refused(recorded, tmp_path, capsys) -> None:
    """A bogus failed copy of RA-7 before the real one: not a certificate (exit 2, one line)."""
    doc = copy.deepcopy(recorded)
    _bogus_first(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(ValueError, match="proposition RA-7 is listed twice"):
        verify(path)
    assert main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "RA-7" in err


def test_an_unchanged_certificate_matches(tmp_path, capsys) -> None:
    """Certified and verified at once (the source hash is compared as it is at both times)."""
    out = tmp_path / "c"
    assert main(["certify", *IDS, "--quick", "--seed", "3", "--out", str(out)]) == 0
    capsys.readouterr()
    path = out / "certificate.json"
    assert main(["verify", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["matches"] and doc["differences"] == [] and doc["seed"] == 3 and doc["quick"]
    assert [p["id"] for p in doc["propositions"]] == IDS
    assert all(p["match"] and p["hash_matches"] for p in doc["propositions"])
    assert doc["recorded_source_hash"] == doc["source_hash"]
    assert main(["verify", str(path)]) == 0
    text = capsys.readouterr().out
    assert text.rstrip().endswith("MATCHES") and "Differences" not in text


def test_a_mismatch_exits_1_and_is_named_in_the_text(recorded, tmp_path, capsys) -> None:
    doc = copy.deepcopy(recorded)
    _prop(doc, "RA-7")["title"] = "Degree"
    assert main(["verify", str(_write(tmp_path, doc))]) == 1
    out = capsys.readouterr().out
    title = _prop(recorded, "RA-7")["title"]
    assert f'- RA-7 title: recorded "Degree"; here "{title}"' in out
    assert out.rstrip().endswith("DOES NOT MATCH")


@pytest.mark.parametrize(
    ("recorded_value", "here", "tolerance", "matches"),
    [
        (1e-15, 1e-15, 1e-10, True),  # the same number
        (0.26, 1e-300, 1.0, False),  # moved past a factor 2 and past t/16
        (1e-5, 1e-300, 1.0, True),  # both within t/16
        (0.0, 0.06, 1.0, True),  # 0 here, rounding-level there: within t/16
        (0.1, 0.19, 1.0, True),  # within a factor 2
        (0.1, 0.21, 1.0, False),  # past a factor 2 and past t/16
        (3e13, 5e13, 1.0, True),  # a control far past its tolerance, within a factor 2
        (3e13, 7e13, 1.0, False),
        (4.0, 4.0, 0.0, True),  # a symbolic check: tolerance 0, exact
        (4.0, 3.0, 0.0, False),  # within a factor 2, but an exact check is exact
        (1e-300, 0.0, 0.0, False),
        (None, None, 1.0, True),  # non-finite both times
        (None, 0.0, 1.0, False),
        (0.0, None, 1.0, False),
        ("0.1", 0.1, 1.0, False),  # not a number
        (True, 1.0, 1.0, False),
    ],
)
def test_the_residual_rule(recorded_value, here, tolerance, matches) -> None:
    assert residual_matches(recorded_value, here, tolerance) is matches


@pytest.mark.parametrize(
    ("recorded_value", "here", "matches"),
    [
        (1.0, 1.0 + 1e-12, True),
        (1.0, 1.01, False),
        (0.0, 0.0, True),
        (1, 1.0, True),
        (None, None, True),
        (None, 1.0, False),
        (False, 0.0, False),
    ],
)
def test_the_tolerance_rule(recorded_value, here, matches) -> None:
    assert tolerance_matches(recorded_value, here) is matches


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return path


def _symlink_to_dev_zero(tmp_path: Path) -> Path:
    path = tmp_path / "zero.json"
    path.symlink_to("/dev/zero")
    return path


def _text(text: str) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        path = tmp_path / "bad.json"
        path.write_text(text, encoding="utf-8")
        return path

    return make


def _bytes(data: bytes) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        path = tmp_path / "bad.json"
        path.write_bytes(data)
        return path

    return make


#: (name, the file, what the refusal says).
BAD_FILES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("nested 100000 deep", _text("[" * 100_000 + "]" * 100_000), "nested too deep to parse"),
    ("nested 201 deep", _text("[" * 201 + "]" * 201), "nested 201 arrays and objects deep"),
    ("/dev/zero", lambda _: Path("/dev/zero"), "not a regular file (it is a character device)"),
    ("a symlink to /dev/zero", _symlink_to_dev_zero, "it is a character device"),
    ("a FIFO", _fifo, "not a regular file (it is a FIFO)"),
    ("a directory", lambda tmp_path: tmp_path, "not a regular file (it is a directory)"),
    ("a missing file", lambda tmp_path: tmp_path / "missing.json", "cannot be read"),
    ("invalid UTF-8", _bytes(b'{"seed": "\xff"}'), "not UTF-8 (byte 0xff at offset 10)"),
    ("NaN", _text('{"seed": NaN}'), "the non-finite number NaN"),
    ("Infinity", _text('{"seed": -Infinity}'), "the non-finite number -Infinity"),
    ("1e999", _text('{"seed": 1e999}'), "the number 1e999 overflows to inf"),
    ("a 200-digit integer", _text('{"seed": ' + "9" * 200 + "}"), "an integer of 200 digits"),
    ("a key twice", _text('{"passed": true, "passed": false}'), 'the key "passed" twice'),
    ("not JSON", _text("{not json"), "not valid JSON"),
]


def _bounded(call: Callable[[], Any]) -> Any:
    """``call()``'s result (or its exception, raised here), run in a thread that must finish
    within 30 s: a FIFO or a device read without end would not."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the read did not return"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _refusal(call: Callable[[], Any]) -> str:
    """The message of the ValueError that ``call()`` raises (within 30 s)."""
    with pytest.raises(ValueError) as info:
        _bounded(call)
    return str(info.value)


@pytest.mark.parametrize(
    ("make", "problem"), [pytest.param(m, p, id=name) for name, m, p in BAD_FILES]
)
def test_a_bad_file_is_refused_naming_it(tmp_path, capsys, make, problem) -> None:
    path = make(tmp_path)
    message = _refusal(lambda: read_json(path))
    assert message.startswith(f"{path}: ") and problem in message and "\n" not in message
    assert _bounded(lambda: main(["verify", str(path)])) == 2
    err = capsys.readouterr().err
    assert err == f"rattn: error: {message}\n"


def test_a_file_larger_than_the_limit_is_refused_by_its_size(tmp_path, monkeypatch, capsys):
    path = _text('{"seed": 0}')(tmp_path)
    assert read_json(path, max_bytes=11) == {"seed": 0}
    message = _refusal(lambda: read_json(path, max_bytes=10))
    assert message == f"{path}: 11 bytes, more than the 10 read at most"
    monkeypatch.setattr(safe_json, "MAX_BYTES", 10)
    assert main(["verify", str(path)]) == 2
    assert capsys.readouterr().err == f"rattn: error: {message}\n"


def test_a_path_with_a_newline_is_named_on_one_line(tmp_path) -> None:
    path = tmp_path / "a\nb.json"
    path.write_text("[NaN]", encoding="utf-8")
    message = _refusal(lambda: read_json(path))
    assert "\n" not in message and message.startswith(ascii(str(path)))


def test_a_file_that_is_not_a_certificate_exits_2(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.json"
    for text, message in (
        ("[1, 2]", "a JSON object is expected"),
        ('{"seed": -1, "quick": true, "propositions": [{"id": "RA-7", "passed": true}]}', "seed"),
        ('{"seed": 0, "quick": true, "propositions": []}', "lists no proposition"),
        ('{"seed": 0, "quick": true, "propositions": [{"id": "RA-7"}]}', "no id or no result"),
        (
            '{"seed": 0, "quick": true, "propositions": [{"id": "RA-7", "passed": true}], '
            '"not_run": [{"id": "RA-7"}]}',
            "RA-7 is listed as run and as not run",
        ),
    ):
        bad.write_text(text)
        assert main(["verify", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{bad}: " in err and message in err
