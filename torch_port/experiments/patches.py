"""Patch-transformer classification: AdamW against Stiefel W_Q, W_K under ``riemannian_adam``.

Data: scikit-learn's bundled digits by default (8×8 grey images cut into 2×2 patches: 16 tokens
of 4 pixels; a fixed split of ``val_size`` test images), or CIFAR-10 from a local directory in
its python-pickle format (``--data-dir``: data_batch_1 … data_batch_5 and test_batch, or a
directory holding cifar-10-batches-py; 32×32×3 images cut into 4×4 patches: 64 tokens of 48
values). Pixels are standardised per channel with the training set's mean and SD.

Model: ``models.Transformer`` with a linear patch embedding, learned positions, pre-LayerNorm
blocks, logits averaged over tokens. Paired seeds: for one seed both arms share every
non-attention weight and the minibatch order (``training.train_run``); frames start orthonormal.

Reported: the paired test-accuracy difference C − A (pp) over the seeds, ``scipy.stats.ttest_rel``
and the win count; and a sweep over training-set fractions at a fixed step budget (does the gap
grow with data?), the full training set being the main comparison itself: the least-squares
slope of the per-seed gap against log2(training images) with its standard error
(``gap_slope``), and whether the mean gaps never decrease (``gap_grows``, descriptive only).
Long runs save a checkpoint every ``checkpoint_every`` steps and resume from it.
"""

from __future__ import annotations

import itertools
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_port.experiments import runs
from torch_port.experiments.arms import ARMS, check_arms, check_optimizer_config
from torch_port.experiments.common import (
    RunOptions,
    configure,
    figure,
    markdown_table,
    output_dir,
    resolve_device,
    results_document,
    write_results,
)
from torch_port.experiments.models import PatchEmbedding, Transformer
from torch_port.experiments.training import Task, train_with

NAME = "patches"
CIFAR_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")

_SMALL = dict(d_model=64, n_layers=2, n_heads=4, d_mlp=128)

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        dataset="digits",
        patch_digits=4,
        patch_cifar10=8,
        val_size=300,
        d_model=16,
        n_layers=1,
        n_heads=2,
        d_mlp=32,
        lr=3e-3,
        betas=[0.9, 0.999],
        weight_decay=0.05,
        trust_tau=0.1,
        batch_size=64,
        steps=12,
        eval_every=6,
        checkpoint_every=6,
        fractions=[0.5],
        sweep_seeds=[0, 1],
        arms=["A", "C"],
        seeds=[0, 1],
    ),
    "quick": dict(
        dataset="digits",
        patch_digits=2,
        patch_cifar10=4,
        val_size=497,
        **_SMALL,
        lr=1e-3,
        betas=[0.9, 0.999],
        weight_decay=0.05,
        trust_tau=0.1,
        batch_size=64,
        steps=300,
        eval_every=100,
        checkpoint_every=100,
        fractions=[0.125, 0.25, 0.5],
        sweep_seeds=[0, 1, 2, 3, 4, 5],
        arms=["A", "C"],
        seeds=list(range(12)),
    ),
    "paper": dict(
        dataset="cifar10",
        patch_digits=2,
        patch_cifar10=4,
        val_size=497,
        d_model=128,
        n_layers=4,
        n_heads=4,
        d_mlp=512,
        lr=1e-3,
        betas=[0.9, 0.999],
        weight_decay=0.05,
        trust_tau=0.1,
        batch_size=128,
        steps=20000,
        eval_every=2000,
        checkpoint_every=2000,
        fractions=[0.1, 0.2, 0.5],
        sweep_seeds=list(range(12)),
        arms=["A", "C"],
        seeds=list(range(12)),
    ),
}

#: The paper's reported numbers (CIFAR-10, 12 paired starts).
PAPER = {"mean_diff_pp": 8.98, "t": 60.6, "wins": 12, "n": 12}


# -- data ---------------------------------------------------------------------------------------
def cifar_directory(data_dir: Path) -> Path:
    """The directory holding the CIFAR-10 batches: ``data_dir`` or its cifar-10-batches-py."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise ValueError(f"CIFAR-10 directory {str(data_dir)!r} does not exist")
    nested = data_dir / "cifar-10-batches-py"
    return nested if nested.is_dir() else data_dir


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler for CIFAR-10's python batches that can build nothing but what the format
    holds: dicts, lists, bytes, str and numbers (pickle's own opcodes) and NumPy arrays of a
    numeric dtype (``ndarray``, ``dtype`` and the array reconstructor). Any other global, e.g. a
    planted ``os.system``, is refused before it is called, so no code from the file runs."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _CIFAR_GLOBALS.get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(
                f"refused to load {module}.{name}: a CIFAR-10 batch holds only dicts, lists, "
                "bytes, numbers and numeric NumPy arrays"
            )
        return allowed


def _numeric_dtype(spec: Any, align: bool = False, copy: bool = False) -> np.dtype:
    """``numpy.dtype`` for a plain numeric type code only (no object or structured dtypes)."""
    if isinstance(spec, bytes):
        spec = spec.decode("ascii", "replace")
    if not isinstance(spec, str | np.dtype):
        raise pickle.UnpicklingError(f"refused a NumPy dtype built from {type(spec).__name__}")
    dtype = np.dtype(spec)
    if dtype.kind not in "biuf":
        raise pickle.UnpicklingError(f"refused a NumPy array of dtype {dtype} (not numeric)")
    return dtype


def _reconstruct(cls: Any, shape: Any, dtype: Any) -> np.ndarray:
    """NumPy's pickle reconstructor for a plain ndarray (no subclass)."""
    if cls is not np.ndarray:
        raise pickle.UnpicklingError(f"refused to reconstruct a {cls!r}")
    return np.ndarray.__new__(np.ndarray, shape, _numeric_dtype(dtype))


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
    """NumPy's pickle-protocol-5 array constructor, for a numeric dtype only."""
    return np.frombuffer(buffer, dtype=_numeric_dtype(dtype)).reshape(shape, order=order)


def _scalar(dtype: Any, data: bytes) -> Any:
    """NumPy's pickled scalar (e.g. a label saved as numpy.int64), for a numeric dtype only."""
    return np.frombuffer(data, dtype=_numeric_dtype(dtype), count=1)[0]


def _encode(text: Any, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` for a string: how pickle protocol 2 writes Python 3 bytes."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError("refused _codecs.encode of anything but a latin-1 string")
    return text.encode("latin1")


#: The only globals a CIFAR-10 batch may name (NumPy 1 and NumPy 2 module paths).
_CIFAR_GLOBALS = {
    ("_codecs", "encode"): _encode,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _numeric_dtype,
    **{
        (f"numpy.{core}.{module}", name): function
        for core in ("core", "_core")
        for module, name, function in (
            ("multiarray", "_reconstruct", _reconstruct),
            ("multiarray", "scalar", _scalar),
            ("numeric", "_frombuffer", _frombuffer),
        )
    },
}


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 32, 32, 3) uint8 and labels (N,) of one pickled CIFAR-10 batch, read with
    ``_CifarUnpickler`` (no code runs) and checked: pixel values integers in 0…255, labels
    integers in 0…9."""
    try:
        with open(path, "rb") as fh:
            batch = _CifarUnpickler(fh, encoding="bytes").load()
    except Exception as exc:  # a truncated, foreign or planted file: name it
        raise ValueError(
            f"CIFAR-10 file {str(path)!r} is not a python pickle batch: {exc}"
        ) from None
    if not isinstance(batch, dict):
        raise ValueError(f"CIFAR-10 file {str(path)!r} holds a {type(batch).__name__}, not a dict")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise ValueError(f"CIFAR-10 file {str(path)!r} lacks the 'data' or 'labels' entry")
    data, labels = _numeric(path, "data", data), _numeric(path, "labels", labels)
    if data.ndim != 2 or data.shape[1] != 3072 or labels.ndim != 1 or len(labels) != len(data):
        raise ValueError(
            f"CIFAR-10 file {str(path)!r}: data of shape {data.shape} with labels of shape "
            f"{labels.shape} (expected (N, 3072) and (N,))"
        )
    for what, values, top in (("pixel values", data, 255), ("labels", labels, 9)):
        if values.size == 0:
            continue
        bad = ~np.isfinite(values) | (values != np.round(values)) | (values < 0) | (values > top)
        if bad.any():
            first = values.reshape(-1)[np.argmax(bad.reshape(-1))].item()
            raise ValueError(
                f"CIFAR-10 file {str(path)!r}: {int(bad.sum())} {what} are not integers in "
                f"0…{top} (e.g. {first!r})"
            )
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.uint8)
    return images, labels.astype(np.int64)


def _numeric(path: Path, what: str, value: Any) -> np.ndarray:
    """``value`` as a real numeric array, or a ValueError naming the file and the entry."""
    try:
        array = np.asarray(value)
    except ValueError as exc:  # ragged lists
        raise ValueError(f"CIFAR-10 file {str(path)!r}: '{what}' is not an array: {exc}") from None
    if array.dtype.kind not in "biuf":
        raise ValueError(
            f"CIFAR-10 file {str(path)!r}: '{what}' must be numeric, got dtype {array.dtype}"
        )
    return array.astype(np.float64) if array.dtype.kind == "f" else array


def load_cifar10(data_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels) from a local CIFAR-10 copy in the
    python-pickle format; a missing or malformed file is a ValueError naming it."""
    root = cifar_directory(data_dir)
    for name in CIFAR_FILES:
        if not (root / name).is_file():
            raise ValueError(
                f"CIFAR-10 directory {str(root)!r} lacks the file {name} (expected the python "
                f"version: {', '.join(CIFAR_FILES)})"
            )
    parts = [_read_cifar_batch(root / name) for name in CIFAR_FILES[:-1]]
    x_test, y_test = _read_cifar_batch(root / "test_batch")
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    return x_train, y_train, x_test, y_test


def load_digits_split(val_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits (1,797 8×8 images, values 0…16) as (N, 8, 8, 1), split by a fixed
    permutation into train and ``val_size`` test images (the same split for every seed)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.float32)[..., None]
    labels = digits.target.astype(np.int64)
    n = len(labels)
    if isinstance(val_size, bool) or not isinstance(val_size, int) or not 0 < val_size < n:
        raise ValueError(f"val_size must be an integer in [1, {n - 1}], got {val_size!r}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0)).numpy()
    test, train = perm[:val_size], perm[val_size:]
    return images[train], labels[train], images[test], labels[test]


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """(N, H, W, C) → (N, (H/patch)·(W/patch), patch·patch·C), patches in row-major order."""
    n, h, w, c = images.shape
    if h % patch or w % patch:
        raise ValueError(f"patch size {patch} does not divide the image size {h}×{w}")
    x = images.reshape(n, h // patch, patch, w // patch, patch, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, (h // patch) * (w // patch), patch * patch * c)


def load_data(config: dict[str, Any], data_dir: Path | None) -> dict[str, torch.Tensor]:
    """Standardised patch tensors and labels of the configured dataset."""
    if config["dataset"] == "cifar10":
        if data_dir is None:
            raise ValueError(
                "the CIFAR-10 configuration needs --data-dir DIR (a local copy in the python "
                f"pickle format: {', '.join(CIFAR_FILES)})"
            )
        xtr, ytr, xte, yte = load_cifar10(data_dir)
        patch = config["patch_cifar10"]
    elif config["dataset"] == "digits":
        xtr, ytr, xte, yte = load_digits_split(config["val_size"])
        patch = config["patch_digits"]
    else:
        raise ValueError(f"unknown dataset {config['dataset']!r}; use digits or cifar10")
    xtr_t = torch.as_tensor(xtr, dtype=torch.float32)
    xte_t = torch.as_tensor(xte, dtype=torch.float32)
    mean = xtr_t.mean(dim=(0, 1, 2))
    sd = xtr_t.std(dim=(0, 1, 2)).clamp_min(1e-6)
    return {
        "x_train": patchify((xtr_t - mean) / sd, patch),
        "y_train": torch.as_tensor(ytr),
        "x_val": patchify((xte_t - mean) / sd, patch),
        "y_val": torch.as_tensor(yte),
    }


def make_task(
    config: dict[str, Any],
    data: dict[str, torch.Tensor],
    fraction: float = 1.0,
    device: torch.device | str = "cpu",
) -> Task:
    """The classification task on the first ⌈fraction·N⌉ training images (the split order is
    already random), with the model of ``config``."""
    if not 0 < fraction <= 1:
        raise ValueError(f"training-set fraction must lie in (0, 1], got {fraction!r}")
    n = max(1, math.ceil(fraction * len(data["y_train"])))
    tokens, patch_dim = data["x_train"].shape[1:]
    d = config["d_model"]

    def make_model(seed: int, qk_geometry: str | None) -> torch.nn.Module:
        return Transformer(
            PatchEmbedding(patch_dim, d),
            d,
            config["n_layers"],
            config["n_heads"],
            config["d_mlp"],
            10,
            tokens,
            seed=seed,
            qk_geometry=qk_geometry,
        ).to(device)

    dev = torch.device(device)
    return Task(
        "patches",
        make_model,
        data["x_train"][:n].to(dev),
        data["y_train"][:n].to(dev),
        data["x_val"].to(dev),
        data["y_val"].to(dev),
        batch_size=config["batch_size"],
        readout="mean",
    )


def check_task(config: dict[str, Any]) -> None:
    """Refuse task settings that cannot run (sizes, intervals, optimizer), naming the bad
    value; the movement and ablation experiments check their patches task with this."""
    for key in ("steps", "eval_every", "batch_size", "d_model", "n_heads", "d_mlp", "n_layers"):
        v = config[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{key} must be a positive integer, got {v!r}")
    every = config["checkpoint_every"]
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"checkpoint_every must be an integer ≥ 0, got {every!r}")
    if config["d_model"] % config["n_heads"]:
        raise ValueError(
            f"d_model={config['d_model']} is not divisible by n_heads={config['n_heads']}"
        )
    if config["dataset"] not in ("digits", "cifar10"):
        raise ValueError(f"unknown dataset {config['dataset']!r}; use digits or cifar10")
    check_optimizer_config(config)


def check_config(config: dict[str, Any]) -> None:
    """Refuse a patches configuration that cannot run: ``check_task`` plus the sweep fractions
    and the arms, naming the bad value."""
    check_task(config)
    for f in config["fractions"]:
        if not (isinstance(f, int | float) and 0 < f < 1):
            raise ValueError(f"sweep fractions must lie in (0, 1), got {f!r}")
    check_arms(config["arms"])


# -- the experiment -------------------------------------------------------------------------------
def _compare(records: list[dict[str, Any]], base: str, other: str) -> dict[str, Any]:
    """Paired statistics (in pp) of ``other`` against ``base`` over the seeds both ran."""
    acc = {(r["arm"], r["seed"]): 100 * r["final_val_acc"] for r in records}
    seeds = sorted(
        {r["seed"] for r in records if (base, r["seed"]) in acc and (other, r["seed"]) in acc}
    )
    a = [acc[(base, s)] for s in seeds]
    b = [acc[(other, s)] for s in seeds]
    stats = runs.paired_stats(a, b)
    stats.update(mean_base=float(np.mean(a)), mean_other=float(np.mean(b)), seeds=seeds)
    return stats


def gap_slope(runs: list[dict[str, Any]], base: str, other: str) -> dict[str, float]:
    """Least-squares slope of the per-seed gap y = acc(other) − acc(base) (pp) against
    x = log2(training images), over every paired (fraction, seed): b = Σ(x − x̄)(y − ȳ)/Σ(x − x̄)²,
    its standard error SE = sqrt(Σ r²/(n − 2) / Σ(x − x̄)²) (r the residuals) and t = b/SE.
    A slope in pp per doubling of the data, with its noise; NaN where it is undefined."""
    acc = {(r["fraction"], r["arm"], r["seed"]): r for r in runs}
    points = [
        (math.log2(r["n_train"]), 100 * (acc[(f, other, s)]["final_val_acc"] - r["final_val_acc"]))
        for (f, arm, s), r in acc.items()
        if arm == base and (f, other, s) in acc
    ]
    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    sxx = float(((x - x.mean()) ** 2).sum()) if len(x) else 0.0
    if len(x) < 3 or sxx == 0:
        return {"slope": math.nan, "se": math.nan, "t": math.nan, "n": len(x)}
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    resid = y - y.mean() - slope * (x - x.mean())
    se = math.sqrt(float((resid**2).sum()) / (len(x) - 2) / sxx)
    return {"slope": slope, "se": se, "t": slope / se if se > 0 else math.nan, "n": len(x)}


def gap_grows(gaps: list[float]) -> bool:
    """Whether the mean gaps never decrease from one fraction to the next: a description of
    noisy means, not a test (``gap_slope`` gives the slope with its standard error)."""
    return bool(all(b >= a for a, b in itertools.pairwise(gaps)))


def run(options: RunOptions) -> dict[str, Any]:
    """Main paired comparison over ``seeds`` and the training-fraction sweep; writes the
    outputs."""
    config = configure(PRESETS, options)
    if options.data_dir is not None:
        config["dataset"] = "cifar10"
    check_config(config)
    device = resolve_device(options.device)
    data = load_data(config, options.data_dir)
    directory = output_dir(options, NAME)
    base, other = config["arms"][0], config["arms"][-1]
    cache_config = runs.run_config(config, ("seeds", "arms", "fractions", "sweep_seeds"))
    full = make_task(config, data, 1.0, device)
    cells = [
        runs.Cell(cache_config, f"{1.0}-{seed}-{arm}", (full, 1.0, seed, arm))
        for seed in config["seeds"]
        for arm in config["arms"]
    ]
    for fraction in config["fractions"]:
        task = make_task(config, data, fraction, device)
        cells += [
            runs.Cell(cache_config, f"{fraction}-{seed}-{arm}", (task, fraction, seed, arm))
            for seed in config["sweep_seeds"]
            for arm in config["arms"]
        ]

    def work(cell: runs.Cell, ck: Any, bar: Any) -> Any:
        task, _, seed, arm = cell.spec
        return train_with(task, config, arm, seed, checkpoint=ck, show_progress=options.progress)

    records = runs.run_cells(directory, cells, work, resume=options.resume)
    for cell, record in zip(cells, records, strict=True):
        task, fraction = cell.spec[:2]
        record["fraction"] = fraction
        record["n_train"] = len(task.y_train)
    main = _compare([r for r in records if r["fraction"] == 1.0], base, other)
    main["n_train"] = len(full.y_train)
    sweep = []
    for fraction in [*sorted(config["fractions"]), 1.0]:
        mine = [r for r in records if r["fraction"] == fraction]
        entry = _compare(mine, base, other)
        entry.update(fraction=fraction, n_train=mine[0]["n_train"])
        sweep.append(entry)
    gaps = [e["mean_diff"] for e in sweep]
    summary = {
        "dataset": config["dataset"],
        "base": base,
        "other": other,
        "main": main,
        "sweep": sweep,
        "gap_grows_with_data": gap_grows(gaps),
        "gap_slope": gap_slope(records, base, other),
        "paper": PAPER,
    }
    summary["plots"] = _plots(directory, records, summary)
    document = results_document(NAME, options, config, records, summary, device)
    write_results(directory, document, markdown(config, summary))
    runs.forget_cached(directory, cells)
    return document


def _plots(directory: Path, runs: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    base, other = summary["base"], summary["other"]
    acc = {(r["arm"], r["seed"]): 100 * r["final_val_acc"] for r in runs if r["fraction"] == 1.0}
    path = directory / "patches_paired.png"
    with figure(path, ncols=2, width=4.5) as axes:
        seeds = summary["main"]["seeds"]
        for s in seeds:
            axes[0].plot([0, 1], [acc[(base, s)], acc[(other, s)]], "o-", color="gray", alpha=0.6)
        axes[0].set_xticks([0, 1], [f"{base} {ARMS[base]}", f"{other} {ARMS[other]}"], fontsize=7)
        axes[0].set_ylabel("test accuracy (%)")
        axes[0].set_title("paired seeds")
        sweep = summary["sweep"]
        axes[1].errorbar(
            [e["n_train"] for e in sweep],
            [e["mean_diff"] for e in sweep],
            yerr=[0.0 if not math.isfinite(e["sd_diff"]) else e["sd_diff"] for e in sweep],
            fmt="o-",
        )
        axes[1].axhline(0.0, color="k", lw=0.5)
        axes[1].set_xscale("log")
        axes[1].set_xlabel("training images")
        axes[1].set_ylabel(f"{other} − {base} (pp), mean ± SD")
        axes[1].set_title("gap against training-set size")
    return [path.name]


def markdown(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """The tables of results.md."""
    base, other = summary["base"], summary["other"]
    m, g = summary["main"], summary["gap_slope"]
    main_table = markdown_table(
        [
            "dataset",
            "train images",
            "seeds",
            f"{base} acc (%)",
            f"{other} acc (%)",
            f"{other} − {base} (pp)",
            "SD (pp)",
            "t",
            "p",
            "wins",
        ],
        [
            [
                summary["dataset"],
                m["n_train"],
                m["n"],
                m["mean_base"],
                m["mean_other"],
                m["mean_diff"],
                m["sd_diff"],
                runs.stat_cell(m["t"]),
                runs.stat_cell(m["p"]),
                f"{m['wins']}/{m['n']}",
            ]
        ],
    )
    sweep_table = markdown_table(
        [
            "fraction",
            "train images",
            "seeds",
            f"{base} acc (%)",
            f"{other} acc (%)",
            "gap (pp)",
            "SD (pp)",
            "t",
            "wins",
        ],
        [
            [
                e["fraction"],
                e["n_train"],
                e["n"],
                e["mean_base"],
                e["mean_other"],
                e["mean_diff"],
                e["sd_diff"],
                runs.stat_cell(e["t"]),
                f"{e['wins']}/{e['n']}",
            ]
            for e in summary["sweep"]
        ],
    )
    return "\n\n".join(
        [
            f"# patches: {summary['dataset']}, {config['steps']} steps of batch "
            f"{config['batch_size']}, d_model {config['d_model']}, {config['n_layers']} layers",
            f"Arms: {base} = {ARMS[base]}, {other} = {ARMS[other]}.",
            "Paired test: scipy.stats.ttest_rel over the seeds (test accuracy in %).",
            main_table,
            "Training-set fraction sweep (same step budget; the fraction 1 row is the main "
            "comparison):",
            sweep_table,
            f"Slope of the per-seed gap against log2(training images): {_num(g['slope'], '+.3g')} "
            f"pp per doubling, SE {_num(g['se'], '.3g')}, t = {_num(g['t'], '.3g')} over "
            f"{g['n']} paired runs. Mean gaps never decreasing with data (a description of "
            f"noisy means, not a test): {summary['gap_grows_with_data']}.",
            f"Paper (CIFAR-10, 12 paired starts): +{PAPER['mean_diff_pp']} pp, t = {PAPER['t']}, "
            f"{PAPER['wins']}/12 wins, gap widening with data.",
        ]
    )


def _num(v: float | None, spec: str) -> str:
    """``v`` formatted with ``spec``; "–" for a missing value (NaN is written as null in JSON)."""
    return "–" if v is None or not math.isfinite(v) else format(v, spec)


def format_summary(document: dict[str, Any]) -> str:
    """The paired result and the sweep's gaps."""
    s = document["summary"]
    m = s["main"]
    gaps = ", ".join(f"{e['n_train']}: {_num(e['mean_diff'], '+.2f')}" for e in s["sweep"])
    return "\n".join(
        [
            f"patches ({document['preset']}, {s['dataset']}): {s['other']} − {s['base']} = "
            f"{_num(m['mean_diff'], '+.2f')} pp over {m['n']} paired seeds (t = "
            f"{_num(m['t'], '.2f')}, "
            f"wins {m['wins']}/{m['n']})",
            f"  gap by training images: {gaps}",
            f"  paper: +{PAPER['mean_diff_pp']} pp, t = {PAPER['t']}, {PAPER['wins']}/12",
        ]
    )
