"""``rattn rank`` (``proofs_checks.cli.rank``, ``reference.capacity.recommend``): planted files
recover the planted rank; every bad input is refused with a one-line ValueError naming the
problem and the measured value."""

from __future__ import annotations

import argparse
import importlib.util
import json

import numpy as np
import pytest

from proofs_checks.cli import rank
from reference import capacity as cap
from reference.capacity import recommend

#: Planted tasks (reference.capacity) and the attention kind each is read with; rank 3 each.
PLANTED = {
    "static": lambda: cap.static_task(300, 20, 12, 6, 3, seed=11, noise=0.1),
    "linear": lambda: cap.linear_qk_task(1000, 16, 16, 16, 3, seed=12, noise=0.01),
    "softmax": lambda: cap.softmax_task(1000, 16, 16, 16, 3, beta=2.0, seed=13, noise=0.01),
}


def write(tmp_path, name="data.npz", **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("attention", list(PLANTED))
def test_planted_files_recover_the_planted_rank(tmp_path, capsys, attention):
    task = PLANTED[attention]()
    path = write(tmp_path, X=task.x, Y=task.y)
    assert rank.run_rank(path, attention=attention, as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["recommended_rank"] == task.rank == 3
    assert isinstance(report["recommended_rank"], int)
    assert report["attention"] == attention and report["S"] == task.x.shape[0]
    assert {"energy_effective_rank", "roy_vetterli_rank", "largest_gap_rank"} <= set(
        report["estimators"]
    )
    assert report["assumptions"] and len(report["spectrum"]) == (
        task.x.shape[1] if attention == "static" else task.x.shape[2]
    )
    if attention == "softmax":
        assert any("partial recovery" in c for c in report["assumptions"])


@pytest.mark.parametrize("attention", ["linear", "softmax"])
def test_attention_floor_is_the_one_function_of_reference_capacity(monkeypatch, attention):
    """``rattn rank`` floors the largest-gap rank with ``capacity.attention_gap_floor`` (the rule
    that EB-4 and EB-8 certify), not with a restated formula."""
    task = PLANTED[attention]()
    calls = []
    real = cap.attention_gap_floor

    def spy(s, noise, n):
        calls.append((noise, n))
        return real(s, noise, n)

    monkeypatch.setattr(cap, "attention_gap_floor", spy)
    report = recommend.estimate(task.x, task.y, attention)
    assert calls == [(report["noise_edge"], task.x.shape[1])]
    expected = max(report["noise_edge"], max(report["spectrum"]) / task.x.shape[1])
    assert report["noise_floor"] == expected
    assert report["estimators"]["largest_gap_rank"] == report["recommended_rank"] == 3


def test_table_output_and_custom_keys(tmp_path, capsys):
    task = PLANTED["linear"]()
    path = write(tmp_path, inputs=task.x, outputs=task.y)
    assert rank.run_rank(path, x_key="inputs", y_key="outputs") == 0
    out = capsys.readouterr().out
    assert "recommended rank: 3" in out and "largest_gap_rank" in out and "assumptions:" in out


def test_softmax_with_self_attention_bias_still_finds_the_gap(tmp_path, capsys):
    """K = UUᵀ (PSD): the value map leaks into the first-order coefficient (partial recovery);
    the energy estimators over-count at n = 16, β = 4, the floored gap rank does not."""
    task = cap.softmax_task(1000, 16, 16, 16, 3, beta=4.0, seed=14, psd=True)
    report = recommend.estimate(task.x, task.y, "softmax")
    assert report["recommended_rank"] == 3
    assert report["estimators"]["energy_threshold_rank(eta=0.99)"] > 3


def test_command_line_arguments(tmp_path, capsys):
    """The argparse wiring that ``rattn rank`` uses."""
    task = PLANTED["static"]()
    path = write(tmp_path, X=task.x, Y=task.y)
    parser = argparse.ArgumentParser()
    rank.add_rank_arguments(parser)
    args = parser.parse_args([str(path), "--attention", "static", "--json"])
    assert rank.run_rank_command(args) == 0
    assert json.loads(capsys.readouterr().out)["recommended_rank"] == 3


def test_plot(tmp_path, capsys, monkeypatch):
    task = PLANTED["static"]()
    path = write(tmp_path, X=task.x, Y=task.y)
    png = tmp_path / "spectrum.png"
    if importlib.util.find_spec("matplotlib") is not None:
        assert rank.run_rank(path, attention="static", plot=png) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        capsys.readouterr()
        # a folder: the plot goes into it, under the command's name, and the report says where
        assert rank.run_rank(path, attention="static", plot=tmp_path, as_json=True) == 0
        assert json.loads(capsys.readouterr().out)["plot"] == str(tmp_path / "rank.png")
        assert (tmp_path / "rank.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    with pytest.raises(ValueError, match=r"--plot needs matplotlib.*rattn\[experiments\]"):
        rank.run_rank(path, attention="static", plot=tmp_path / "other.png")
    assert capsys.readouterr().out == ""  # refused before any work or output


# -- bad input -------------------------------------------------------------------------------------
def _good(s=40, n=6, d=4, dv=3):
    rng = np.random.default_rng(0)
    return rng.standard_normal((s, n, d)), rng.standard_normal((s, n, dv))


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"cannot read .*missing\.npz.*no such file"):
        rank.run_rank(tmp_path / "missing.npz")


def test_not_an_archive(tmp_path):
    path = tmp_path / "text.npz"
    path.write_text("not numpy data")
    with pytest.raises(ValueError, match=r"as a \.npz archive"):
        rank.run_rank(path)
    single = tmp_path / "single.npy"
    np.save(single, np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="single array"):
        rank.run_rank(single)


def test_missing_key_lists_the_arrays(tmp_path):
    x, y = _good()
    path = write(tmp_path, inputs=x, Y=y)
    with pytest.raises(ValueError, match=r"no array 'X' for X \(arrays: 'Y', 'inputs'\).*--x"):
        rank.run_rank(path)
    with pytest.raises(ValueError, match=r"no array 'out' for Y.*--y"):
        rank.run_rank(path, x_key="inputs", y_key="out")


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        (
            {"X": np.zeros((4, 5)), "Y": np.zeros((4, 5, 2))},
            r"X \('X'\) must have shape \(S, n, d\), got \(4, 5\)",
        ),
        (
            {"X": np.zeros((4, 5, 3)), "Y": np.zeros((4, 6, 2))},
            r"same number .*\(4, 5, 3\).*\(4, 6, 2\)",
        ),
        ({"X": np.zeros((4, 5, 3)), "Y": np.zeros((3, 5, 2))}, r"\(S, n\)"),
        ({"X": np.zeros((4, 0, 3)), "Y": np.zeros((4, 0, 2))}, "empty"),
        ({"X": np.array([[["a"]]]), "Y": np.zeros((1, 1, 1))}, "real numeric array, got dtype <U1"),
    ],
)
def test_shape_and_type_errors(tmp_path, arrays, match):
    path = write(tmp_path, **arrays)
    with pytest.raises(ValueError, match=match):
        rank.run_rank(path)


def test_non_finite_data(tmp_path):
    x, y = _good()
    y[0, 0, 0], y[1, 2, 1] = np.nan, np.inf
    path = write(tmp_path, X=x, Y=y)
    with pytest.raises(ValueError, match=r"Y \('Y'\) has 2 non-finite entries"):
        rank.run_rank(path)


@pytest.mark.parametrize(
    ("attention", "s", "match"),
    [
        ("softmax", 4, r"too few sequences for --attention softmax: S = 4, needs S ≥ 5"),
        ("static", 1, r"S = 1, needs S ≥ 2"),
        ("linear", 1, r"S = 1, needs S ≥ 2"),
    ],
)
def test_too_few_sequences(tmp_path, attention, s, match):
    x, y = _good(s=s)
    path = write(tmp_path, X=x, Y=y)
    with pytest.raises(ValueError, match=match):
        rank.run_rank(path, attention=attention)


def test_one_token_and_bad_attention(tmp_path):
    x, y = _good(n=1)
    path = write(tmp_path, X=x, Y=y)
    with pytest.raises(ValueError, match="at least 2 tokens per sequence to mix, got n = 1"):
        rank.run_rank(path)
    with pytest.raises(ValueError, match="attention must be one of linear, softmax, static"):
        rank.run_rank(path, attention="cosine")
