"""The Stiefel-attention experiments (grokking, patches, movement, ablation) and their arms."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")
pytest.importorskip("sklearn")

from proofs_checks.cli import main  # noqa: E402
from torch_port import linalg  # noqa: E402
from torch_port.experiments import ablation, grokking, movement, patches  # noqa: E402
from torch_port.experiments import arms as arms_lib  # noqa: E402
from torch_port.experiments.common import Checkpoint, RunOptions, configure  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NAMES = ("grokking", "patches", "movement", "ablation")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Each experiment's smoke preset, run once through the CLI."""
    out = tmp_path_factory.mktemp("smoke")
    docs = {}
    for name in NAMES:
        assert main(["experiment", name, "--preset", "smoke", "--out", str(out)]) == 0
        path = out / name / "results.json"
        docs[name] = json.loads(path.read_text("utf-8"))
        docs[name]["_dir"] = str(out / name)
    return docs


@pytest.mark.parametrize("name", NAMES)
def test_smoke_writes_documented_outputs(smoke: dict, name: str) -> None:
    doc = smoke[name]
    assert {"experiment", "preset", "config", "runs", "summary", "environment"} <= set(doc)
    assert doc["experiment"] == name and doc["preset"] == "smoke"
    directory = Path(doc["_dir"])
    assert (directory / "results.md").read_text("utf-8").startswith(f"# {name}")
    assert doc["summary"]["plots"]
    for plot in doc["summary"]["plots"]:
        assert (directory / plot).read_bytes()[:8] == PNG_MAGIC
    assert not list(directory.glob("checkpoint-*"))  # removed once the outputs are written


def test_grokking_summary_and_logs(smoke: dict) -> None:
    doc = smoke["grokking"]
    assert set(doc["summary"]["arms"]) == {"A", "C"}
    for r in doc["runs"]:
        m = r["metrics"]
        assert 0 <= m["final_val_acc"] <= 1 and 0 <= m["fraction_at_threshold"] <= 1
        h = r["history"]
        assert [e["step"] for e in h] == list(range(0, 25, 4))
        assert {"embed", "pos", "w_q", "w_k", "w_v", "w_o", "mlp_in", "mlp_out", "unembed"} <= set(
            h[-1]["norms"]
        )
        assert h[0]["angles"]["w_q"] < 1e-3 < h[-1]["angles"]["w_q"]  # frames left their start
    # decay shrinks the decayed MLP weights in both arms; A's W_Q is decayed, C's frames keep
    # ‖W‖_F = √(heads·d_head) exactly (RA-5: decay cannot act on a frame)
    runs = {r["arm"]: r for r in doc["runs"]}
    c_norm = runs["C"]["history"][-1]["norms"]["w_q"]
    assert c_norm == pytest.approx(math.sqrt(32), rel=1e-5)


def test_movement_fixed_step_moves_less_and_frozen_does_not_move(smoke: dict) -> None:
    for t in smoke["movement"]["summary"]["tasks"].values():
        assert t["ratios"]["A/B"] > 10  # degree-one steps are tiny against Adam-shaped ones
        assert t["arms"]["G"]["median_step"]["both"] == 0.0
        assert t["arms"]["G"]["drift"] == 0.0
        assert t["arms"]["C"]["median_step"]["both"] > 0


def test_ablation_runs_all_arms(smoke: dict) -> None:
    for t in smoke["ablation"]["summary"]["tasks"].values():
        assert set(t["arms"]) == set("ABCDEFGH")


def test_patches_paired_statistics(smoke: dict) -> None:
    doc = smoke["patches"]
    main_stats = doc["summary"]["main"]
    acc = {
        (r["arm"], r["seed"]): 100 * r["final_val_acc"] for r in doc["runs"] if r["fraction"] == 1
    }
    diffs = [acc[("C", s)] - acc[("A", s)] for s in (0, 1)]
    assert main_stats["mean_diff"] == pytest.approx(np.mean(diffs))
    assert main_stats["wins"] == sum(d > 0 for d in diffs)
    assert [e["fraction"] for e in doc["summary"]["sweep"]] == [0.5, 1.0]


def _run_quiet(name: str, out: Path, **kw) -> dict:
    module = {"grokking": grokking, "patches": patches}[name]
    return module.run(RunOptions(preset="smoke", out=out, progress=False, **kw))


def test_deterministic_under_the_seed(tmp_path: Path) -> None:
    a = _run_quiet("grokking", tmp_path / "a")
    b = _run_quiet("grokking", tmp_path / "b")
    assert [r["history"] for r in a["runs"]] == [r["history"] for r in b["runs"]]
    c = _run_quiet("grokking", tmp_path / "c", seeds=(1,))
    assert [r["history"] for r in c["runs"]] != [r["history"] for r in a["runs"]]


def _tasks() -> dict[str, arms_lib.Task]:
    gcfg = grokking.PRESETS["smoke"]
    pcfg = patches.PRESETS["smoke"]
    data = patches.load_data(pcfg, None)
    return {
        "grokking": grokking.make_task(gcfg, 0),
        "patches": patches.make_task(pcfg, data, 0.5),
    }


@pytest.mark.parametrize(
    ("task_name", "arm"), [("grokking", "C"), ("patches", "E"), ("patches", "H")]
)
def test_resume_equals_uninterrupted(tmp_path: Path, task_name: str, arm: str) -> None:
    task = _tasks()[task_name]
    kw = dict(
        steps=12,
        lr=3e-3,
        betas=(0.9, 0.98),
        weight_decay=1.0,
        trust_radius=0.3,
        eval_every=3,
        track_movement=True,
    )
    whole = arms_lib.train_run(task, arm, 0, **kw)
    ck = Checkpoint(tmp_path, {"t": task_name}, arm)
    assert arms_lib.train_run(task, arm, 0, checkpoint=ck, stop_after=7, **kw) is None
    assert ck.path.exists()
    resumed = arms_lib.train_run(task, arm, 0, checkpoint=ck, **kw)
    assert resumed == whole
    assert not ck.path.exists()


def test_arms_keep_frames_orthonormal_and_share_plain_init() -> None:
    task = _tasks()["grokking"]
    models = {}
    for arm in "ABCDEFGH":
        model = arms_lib.prepare_model(arm, task.make_model(0, arms_lib.arm_geometry(arm)))
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = arms_lib.make_optimizer(
            arm, model, lr=1e-2, betas=(0.9, 0.98), weight_decay=1.0, trust_radius=0.3
        )
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(
                arms_lib.logits_of(task, model, task.x_train), task.y_train
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        qk = arms_lib.qk_parameters(model)
        for p in qk.values():
            res = float(linalg.orthonormality_residual(p.detach()).max())
            if arm == "A":
                assert res > 0.1  # plain AdamW matrices are not orthonormal
            else:
                assert res < 1e-5, (arm, res)
        if arm == "G":
            for n, p in qk.items():
                assert torch.equal(p, init[n])
        assert not torch.equal(model.embed.weight, init["embed.weight"])
        models[arm] = init
    for arm in "BCDEFGH":  # paired starts: every non-attention weight is the same
        for n, v in models["A"].items():
            if ".attn." not in n:
                assert torch.equal(models[arm][n], v), (arm, n)


def test_arm_e_first_step_is_raw_gradient_adam_then_polar() -> None:
    gen = torch.Generator().manual_seed(3)
    w0 = torch.linalg.qr(torch.randn(2, 12, 4, generator=gen, dtype=torch.float64))[0]
    g = torch.randn(2, 12, 4, generator=gen, dtype=torch.float64)
    p = torch.nn.Parameter(w0.clone())
    opt = arms_lib.ScalarAdamPolar([p], lr=0.05, betas=(0.9, 0.99), eps=0.0)
    p.grad = g.clone()
    opt.step()
    rms = g.square().mean(dim=(-2, -1)).sqrt()[:, None, None]
    expected = linalg.polar(w0 - 0.05 * g / rms)  # m̂ = G, √v̂ = RMS(G) at step 1
    assert torch.allclose(p.detach(), expected, atol=1e-12)
    # the projector matters: riemannian_adam's first step uses P_W(G) instead
    projected = g - w0 @ linalg.sym(w0.transpose(-1, -2) @ g)
    other = linalg.polar(
        w0 - 0.05 * projected / projected.square().mean((-2, -1)).sqrt()[:, None, None]
    )
    assert not torch.allclose(other, expected, atol=1e-6)


def test_paired_stats_and_grokking_metrics() -> None:
    s = arms_lib.paired_stats([1.0, 2.0, 3.0], [2.0, 4.0, 3.5])
    d = np.array([1.0, 2.0, 0.5])
    assert s["mean_diff"] == pytest.approx(d.mean())
    assert s["t"] == pytest.approx(d.mean() / (d.std(ddof=1) / math.sqrt(3)))
    assert s["wins"] == 3
    hist = [
        {"step": k, "val_acc": v, "train_acc": 1.0, "angles": {"w_q": 0.0, "w_k": 0.0}}
        for k, v in [(0, 0.0), (10, 0.2), (20, 0.96), (30, 0.5), (40, 0.97), (50, 0.99)]
    ]
    m = grokking.run_metrics(hist, 0.95, 0.4)
    assert m["final_val_acc"] == 0.99
    assert m["last_mean_val_acc"] == pytest.approx(0.98)  # last 2 of 5 evaluations
    assert m["fraction_at_threshold"] == pytest.approx(3 / 5)
    assert m["first_step_at_threshold"] == 20


def test_patchify_row_major() -> None:
    img = torch.arange(16.0).reshape(1, 4, 4, 1)
    x = patches.patchify(img, 2)
    assert x.shape == (1, 4, 4)
    assert x[0, 1].tolist() == [2.0, 3.0, 6.0, 7.0]
    with pytest.raises(ValueError, match="patch size 3"):
        patches.patchify(img, 3)


def _fake_cifar(directory: Path, n: int = 6, skip: str | None = None) -> None:
    gen = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    for name in patches.CIFAR_FILES:
        if name == skip:
            continue
        batch = {
            b"data": gen.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"labels": list(gen.integers(0, 10, n)),
        }
        (directory / name).write_bytes(pickle.dumps(batch))


def test_patches_reads_a_local_cifar10(tmp_path: Path) -> None:
    _fake_cifar(tmp_path / "data" / "cifar-10-batches-py")
    out = tmp_path / "out"
    assert (
        main(
            [
                "experiment",
                "patches",
                "--preset",
                "smoke",
                "--out",
                str(out),
                "--data-dir",
                str(tmp_path / "data"),
            ]
        )
        == 0
    )
    doc = json.loads((out / "patches" / "results.json").read_text("utf-8"))
    assert doc["summary"]["dataset"] == "cifar10"
    assert doc["summary"]["main"]["n_train"] == 30
    xtr, _, xte, _ = patches.load_cifar10(tmp_path / "data")
    assert xtr.shape == (30, 32, 32, 3) and xte.shape == (6, 32, 32, 3)


def test_bad_input_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _fake_cifar(tmp_path / "missing", skip="data_batch_1")
    code = main(
        [
            "experiment",
            "patches",
            "--preset",
            "smoke",
            "--out",
            str(tmp_path / "o"),
            "--data-dir",
            str(tmp_path / "missing"),
        ]
    )
    assert code == 2
    assert "data_batch_1" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    for name in patches.CIFAR_FILES:
        (tmp_path / "bad" / name).write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"data_batch_1.*not a python pickle"):
        patches.load_cifar10(tmp_path / "bad")
    with pytest.raises(ValueError, match="lacks the file"):
        patches.load_data({**patches.PRESETS["smoke"], "dataset": "cifar10"}, tmp_path / "missing")
    with pytest.raises(ValueError, match="does not exist"):
        patches.load_cifar10(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="needs --data-dir"):
        patches.load_data(patches.PRESETS["paper"], None)
    with pytest.raises(ValueError, match="p must be an integer ≥ 3, got 2"):
        grokking.run(RunOptions(preset="smoke", out=tmp_path, overrides={"p": 2}))
    with pytest.raises(ValueError, match="train_fraction"):
        grokking.check_config({**grokking.PRESETS["smoke"], "train_fraction": 1.5})
    with pytest.raises(ValueError, match="unknown arms"):
        arms_lib.check_arms(["A", "Z"])
    with pytest.raises(ValueError, match="unknown tasks"):
        movement.check_config({**movement.PRESETS["smoke"], "tasks": {"mnist": {}}})
    with pytest.raises(ValueError, match="sweep fractions"):
        patches.check_config({**patches.PRESETS["smoke"], "fractions": [0.0]})
    with pytest.raises(ValueError, match="unknown configuration keys"):
        configure(ablation.PRESETS, RunOptions(preset="smoke", overrides={"lr": 1.0}))
