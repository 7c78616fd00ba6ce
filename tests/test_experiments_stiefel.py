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
from torch_port.experiments import (  # noqa: E402
    ablation,
    grokking,
    movement,
    patch_data,
    patches,
    suite,
    training,
)
from torch_port.experiments import arms as arms_lib  # noqa: E402
from torch_port.experiments import runs as runs_lib  # noqa: E402
from torch_port.experiments.common import Checkpoint, RunOptions, configure  # noqa: E402
from torch_port.optim import RiemannianAdam  # noqa: E402

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
        assert h[0]["angles"]["w_q"] < 1e-9 < 1e-3 < h[-1]["angles"]["w_q"]  # frames moved
    # C's frames keep ‖W‖_F = √(heads·d_head) exactly (they stay orthonormal)
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


def _tasks() -> dict[str, training.Task]:
    gcfg = grokking.PRESETS["smoke"]
    pcfg = patches.PRESETS["smoke"]
    data = patch_data.load_data(pcfg, None)
    return {
        "grokking": grokking.make_task(gcfg, 0),
        "patches": patches.make_task(pcfg, data, 0.5),
    }


_RESUME_KW = dict(
    steps=12,
    lr=3e-3,
    betas=(0.9, 0.98),
    weight_decay=1.0,
    trust_radius=0.3,
    eval_every=3,
    track_movement=True,
    track_trust=True,
)


@pytest.mark.parametrize(
    ("task_name", "arm", "stop"),
    [("grokking", "C", 7), ("patches", "E", 7), ("patches", "H", 7), ("grokking", "A", 0)],
)
def test_resume_equals_uninterrupted(tmp_path: Path, task_name: str, arm: str, stop: int) -> None:
    task = _tasks()[task_name]
    whole = training.train_run(task, arm, 0, **_RESUME_KW)
    assert [h["step"] for h in whole["history"]] == [0, 3, 6, 9, 12]
    ck = Checkpoint(tmp_path, {"t": task_name}, arm)
    assert training.train_run(task, arm, 0, checkpoint=ck, stop_after=stop, **_RESUME_KW) is None
    assert ck.path.exists()
    resumed = training.train_run(task, arm, 0, checkpoint=ck, **_RESUME_KW)
    assert resumed == whole  # stop_after=0: the step-0 evaluation is logged once
    assert ck.path.exists()  # run_cached removes it, once the finished record is saved


def test_logged_train_loss_is_the_whole_training_set_after_the_step(tmp_path: Path) -> None:
    task = _tasks()["patches"]  # minibatches of 64 out of 749 images
    ck = Checkpoint(tmp_path, {"t": "loss"}, "C")
    kw = {**_RESUME_KW, "track_movement": False}
    assert training.train_run(task, "C", 0, checkpoint=ck, stop_after=3, **kw) is None
    saved = ck.load()
    assert saved["history"][-1]["step"] == 3
    model = task.make_model(0, "stiefel")
    model.load_state_dict(saved["model"])  # the model after step 3
    with torch.no_grad():
        full = torch.nn.functional.cross_entropy(
            training.logits_of(task, model, task.x_train), task.y_train
        )
    assert saved["history"][-1]["train_loss"] == pytest.approx(float(full), rel=1e-5)
    run = training.train_run(task, "C", 0, checkpoint=ck, **kw)
    assert run["n_train"] == 749 and run["n_val"] == 300


def test_saved_frames_follow_the_model_device() -> None:
    task = _tasks()["grokking"]
    model = task.make_model(0, "stiefel").to("meta")
    saved = {n: torch.zeros(p.shape, dtype=torch.float64) for n, p in model.named_parameters()}
    moved = training.frames_like(saved, model)
    assert set(moved) == set(arms_lib.qk_parameters(model))
    assert all(t.device.type == "meta" and t.dtype == torch.float32 for t in moved.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_resume_on_cuda_equals_uninterrupted(tmp_path: Path) -> None:
    cfg = grokking.PRESETS["smoke"]
    task = grokking.make_task(cfg, 0, "cuda")
    whole = training.train_run(task, "C", 0, **_RESUME_KW)
    ck = Checkpoint(tmp_path, {"t": "cuda"}, "C")
    assert training.train_run(task, "C", 0, checkpoint=ck, stop_after=5, **_RESUME_KW) is None
    resumed = training.train_run(task, "C", 0, checkpoint=ck, **_RESUME_KW)
    assert resumed == whole


def _step(task: training.Task, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    loss = torch.nn.functional.cross_entropy(
        training.logits_of(task, model, task.x_train), task.y_train
    )
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_arms_keep_frames_orthonormal_move_them_and_share_plain_init() -> None:
    task = _tasks()["grokking"]
    models = {}
    for arm in "ABCDEFGH":
        model = arms_lib.prepare_model(arm, task.make_model(0, arms_lib.arm_geometry(arm)))
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = arms_lib.make_optimizer(
            arm, model, lr=1e-2, betas=(0.9, 0.98), weight_decay=1.0, trust_radius=0.3
        )
        qk = arms_lib.qk_parameters(model)
        ids = {id(p) for p in qk.values()}
        for g in opt.param_groups:  # only A decays W_Q, W_K
            if any(id(p) in ids for p in g["params"]):
                assert g.get("weight_decay", 0.0) == (1.0 if arm == "A" else 0.0), arm
        for _ in range(3):
            _step(task, model, opt)
        for n, p in qk.items():
            res = float(linalg.orthonormality_residual(p.detach()).max())
            if arm == "A":
                assert res > 0.1  # plain AdamW matrices are not orthonormal
            else:
                assert res < 1e-5, (arm, res)
            angle = training.max_principal_angle(init[n], p.detach())
            if arm == "G":
                assert torch.equal(p, init[n])
            else:  # every trained arm turns every head's subspace
                assert float(angle.min()) > 1e-4, (arm, n, angle)
        assert not torch.equal(model.embed.weight, init["embed.weight"])
        models[arm] = init
    for arm in "BCDEFGH":  # paired starts: every non-attention weight is the same
        for n, v in models["A"].items():
            if ".attn." not in n:
                assert torch.equal(models[arm][n], v), (arm, n)


def _frames(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w0 = torch.linalg.qr(torch.randn(2, 12, 4, generator=gen, dtype=torch.float64))[0]
    g1 = torch.randn(2, 12, 4, generator=gen, dtype=torch.float64)
    g2 = (
        torch.randn(2, 12, 4, generator=gen, dtype=torch.float64)
        * torch.tensor([1.0, 5.0])[:, None, None]
    )
    return w0, g1, g2


@pytest.mark.parametrize("radius", [None, 0.2])
def test_arm_e_two_steps_match_a_hand_computation(radius: float | None) -> None:
    w0, g1, g2 = _frames()
    lr, b1, b2 = 0.05, 0.9, 0.999
    p = torch.nn.Parameter(w0.clone())
    opt = _arm_e([p], lr=lr, betas=(b1, b2), eps=0.0, trust_radius=radius)
    w, m, v = w0.clone(), torch.zeros_like(w0), torch.zeros(2, dtype=torch.float64)
    capped = []
    for t, g in enumerate((g1, g2), start=1):
        p.grad = g.clone()
        opt.step()
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g.square().mean(dim=(-2, -1))
        xi = -lr * (m / (1 - b1**t)) / (v / (1 - b2**t)).sqrt()[:, None, None]
        if radius is not None:
            norm = xi.square().sum(dim=(-2, -1)).sqrt()
            capped.append(norm > radius)
            xi = xi * torch.clamp(radius / norm, max=1.0)[:, None, None]
        w = linalg.polar(w + xi)
        assert torch.allclose(p.detach(), w, atol=1e-12), t
    if radius is not None:
        assert all(bool(c.all()) for c in capped)  # the cap acted at both steps
    # the projector matters: riemannian_adam's first step uses P_W(G) instead
    projected = g1 - w0 @ linalg.sym(w0.transpose(-1, -2) @ g1)
    other = linalg.polar(
        w0 - lr * projected / projected.square().mean((-2, -1)).sqrt()[:, None, None]
    )
    first = linalg.polar(w0 - lr * g1 / g1.square().mean((-2, -1)).sqrt()[:, None, None])
    assert not torch.allclose(other, first, atol=1e-6)


def _arm_e(params, trust_radius=None, **kw) -> torch.optim.Optimizer:
    """Arm E's optimizer on a group of frames alone."""
    group = {"params": params, "geometry": "stiefel", "gradient": "euclidean"}
    return RiemannianAdam([{**group, "trust_radius": trust_radius}], **kw)


def test_arm_e_refuses_bad_options_and_non_finite_gradients() -> None:
    w0, g1, _ = _frames()
    p = torch.nn.Parameter(w0.clone())
    for kw, match in [
        ({"lr": -1.0}, "lr must be a finite number ≥ 0, got -1.0"),
        ({"betas": (0.9, 1.0)}, r"beta2 must lie in \[0, 1\), got 1.0"),
        ({"eps": -1.0}, "eps must be a finite number ≥ 0, got -1.0"),
        ({"trust_radius": 0.0}, "trust_radius must be a positive finite number, got 0.0"),
    ]:
        with pytest.raises(ValueError, match=match):
            _arm_e([p], **{"lr": 0.1, **kw})
    # bfloat16 frames: √v is kept in float32 (√β2·√v would round back to √v in bfloat16)
    q = torch.nn.Parameter(linalg.polar(w0).to(torch.bfloat16))
    opt = _arm_e([q], lr=0.01)
    q.grad = g1.to(torch.bfloat16)
    opt.step()
    assert opt.state[q]["sqrt_v"].dtype == torch.float32
    state = opt.state_dict()
    again = _arm_e([q], lr=0.01)
    again.load_state_dict(state)
    assert again.state[q]["sqrt_v"].dtype == torch.float32
    # arm E: a NaN in one W_Q gradient stops the step before the AdamW part has run
    task = _tasks()["grokking"]
    model = arms_lib.prepare_model("E", task.make_model(0, "stiefel"))
    opt_e = arms_lib.make_optimizer("E", model, lr=1e-2, betas=(0.9, 0.98), weight_decay=1.0)
    loss = torch.nn.functional.cross_entropy(
        training.logits_of(task, model, task.x_train), task.y_train
    )
    loss.backward()
    model.blocks[0].attn.w_q.grad[0, 0, :3] = float("nan")
    before = {n: t.detach().clone() for n, t in model.named_parameters()}
    with pytest.raises(ValueError, match=r"'blocks\.0\.attn\.w_q' .*: 3 non-finite entries"):
        opt_e.step()
    for n, t in model.named_parameters():
        assert torch.equal(t, before[n]), n


def test_arm_h_is_undecayed_adamw_then_polar() -> None:
    task = _tasks()["grokking"]
    lr, eps = 0.05, 1e-8
    model = arms_lib.prepare_model("H", task.make_model(0, None))
    qk = arms_lib.qk_parameters(model)
    w0 = {n: p.detach().double().clone() for n, p in qk.items()}
    for p in w0.values():  # H starts from polar(W)
        assert float(linalg.orthonormality_residual(p).max()) < 1e-5
    opt = arms_lib.make_optimizer("H", model, lr=lr, betas=(0.9, 0.98), weight_decay=1.0, eps=eps)
    loss = torch.nn.functional.cross_entropy(
        training.logits_of(task, model, task.x_train), task.y_train
    )
    opt.zero_grad()
    loss.backward()
    grads = {n: p.grad.double().clone() for n, p in qk.items()}
    opt.step()
    for n, p in qk.items():
        g = grads[n]
        step = lr * g / (g.abs() + eps)  # AdamW's first step: m̂ = G, √v̂ = |G|
        expected = linalg.polar(w0[n] - step)
        decayed = linalg.polar((1 - lr * 1.0) * w0[n] - step)  # = polar(W0 − step/(1 − lr·λ))
        assert torch.allclose(p.detach().double(), expected, atol=2e-5), n
        assert not torch.allclose(decayed, expected, atol=1e-3), n


def _rotated(d: int, r: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """W0 = [e_1 … e_r] and W with its first column turned by θ towards e_{r+1}: the largest
    principal angle between the spans is θ."""
    w0 = torch.eye(d, dtype=torch.float64)[:, :r]
    w = w0.clone()
    w[:, 0] = math.cos(theta) * w0[:, 0]
    w[r, 0] = math.sin(theta)
    return w0, w


@pytest.mark.parametrize("theta", [1e-4, 0.3, math.pi / 2 - 1e-4])
def test_max_principal_angle_of_a_known_rotation(theta: float) -> None:
    w0, w = _rotated(12, 4, theta)
    gen = torch.Generator().manual_seed(0)
    mix = torch.linalg.qr(torch.randn(4, 4, generator=gen, dtype=torch.float64))[0]
    scale = torch.diag(torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64))
    # the angle is one of subspaces: any change of basis within the span leaves it unchanged
    got = training.max_principal_angle(w0 @ scale, w @ mix @ scale)
    assert float(got) == pytest.approx(math.degrees(theta), rel=1e-9)
    same = training.max_principal_angle(w0, w0 @ mix)
    assert float(same) < 1e-10  # arccos(σ_min) would floor at ~1e-6° here


def test_component_of_names_every_part_of_the_models() -> None:
    task = _tasks()["patches"]
    names = dict.fromkeys(n for n, _ in task.make_model(0, None).named_parameters())
    got = {n: training.component_of(n) for n in names}
    assert got["pos"] == "pos" and got["embed.weight"] == got["embed.bias"] == "embed"
    assert got["blocks.0.attn.w_q"] == "w_q" and got["blocks.0.attn.w_o"] == "w_o"
    assert got["blocks.0.mlp.0.weight"] == got["blocks.0.mlp.0.bias"] == "mlp_in"
    assert got["blocks.0.mlp.2.weight"] == "mlp_out"
    assert got["blocks.0.norm1.weight"] == got["norm.bias"] == "norm"
    assert got["head.weight"] == got["head.bias"] == "unembed"
    norms = training.component_norms(task.make_model(0, "stiefel"))
    assert norms["w_q"] == pytest.approx(math.sqrt(2 * 8))  # 2 heads × 8 orthonormal columns


def test_paired_stats_and_grokking_metrics() -> None:
    s = runs_lib.paired_stats([1.0, 2.0, 3.0], [2.0, 4.0, 3.5])
    d = np.array([1.0, 2.0, 0.5])
    assert s["mean_diff"] == pytest.approx(d.mean())
    assert s["t"] == pytest.approx(d.mean() / (d.std(ddof=1) / math.sqrt(3)))
    assert s["wins"] == 3
    up = runs_lib.paired_stats([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])  # every seed +0.5: SD 0
    assert up["t"] == math.inf and up["p"] == 0.0 and up["sd_diff"] == 0.0
    down = runs_lib.paired_stats([1.0, 2.0], [0.0, 1.0])
    assert down["t"] == -math.inf and down["p"] == 0.0
    assert runs_lib.stat_cell(down["t"]) == "−∞"
    tie = runs_lib.paired_stats([1.0, 2.0], [1.0, 2.0])
    assert math.isnan(tie["t"]) and math.isnan(tie["p"])
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
    x = patch_data.patchify(img, 2)
    assert x.shape == (1, 4, 4)
    assert x[0, 1].tolist() == [2.0, 3.0, 6.0, 7.0]
    with pytest.raises(ValueError, match="patch size 3"):
        patch_data.patchify(img, 3)


def _fake_cifar(directory: Path, n: int = 6, skip: str | None = None) -> None:
    gen = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    for name in patch_data.CIFAR_FILES:
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
    xtr, _, xte, _ = patch_data.load_cifar10(tmp_path / "data")
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
    for name in patch_data.CIFAR_FILES:
        (tmp_path / "bad" / name).write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"data_batch_1.*not a python pickle"):
        patch_data.load_cifar10(tmp_path / "bad")
    with pytest.raises(ValueError, match="lacks the file"):
        patch_data.load_data(
            {**patches.PRESETS["smoke"], "dataset": "cifar10"}, tmp_path / "missing"
        )
    with pytest.raises(ValueError, match="does not exist"):
        patch_data.load_cifar10(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="needs --data-dir"):
        patch_data.load_data(patches.PRESETS["paper"], None)
    with pytest.raises(ValueError, match="p must be an integer ≥ 3, got 2"):
        grokking.run(RunOptions(preset="smoke", out=tmp_path, overrides={"p": 2}))
    with pytest.raises(ValueError, match="train_fraction"):
        grokking.check_config({**grokking.PRESETS["smoke"], "train_fraction": 1.5})
    with pytest.raises(ValueError, match="unknown arms"):
        arms_lib.check_arms(["A", "Z"])
    with pytest.raises(ValueError, match="unknown tasks"):
        suite.check_tasks({**movement.PRESETS["smoke"], "tasks": {"mnist": {}}})
    with pytest.raises(ValueError, match="sweep fractions"):
        patches.check_config({**patches.PRESETS["smoke"], "fractions": [0.0]})
    with pytest.raises(ValueError, match="unknown configuration keys"):
        configure(ablation.PRESETS, RunOptions(preset="smoke", overrides={"lr": 1.0}))


def _small_movement(**overrides) -> dict:
    """Overrides of the movement smoke preset: the patches task only, arms A and G."""
    tasks = {"patches": movement.PRESETS["smoke"]["tasks"]["patches"]}
    return {"tasks": tasks, "arms": ["A", "G"], **overrides}


def test_movement_with_data_dir_records_and_trains_cifar10(tmp_path: Path) -> None:
    _fake_cifar(tmp_path / "data")
    opts = dict(preset="smoke", progress=False, overrides=_small_movement())
    doc = movement.run(RunOptions(out=tmp_path / "o", data_dir=tmp_path / "data", **opts))
    assert doc["config"]["tasks"]["patches"]["dataset"] == "cifar10"
    assert {r["n_train"] for r in doc["runs"]} == {30}  # the fake CIFAR's 5 × 6 images
    assert movement.PRESETS["smoke"]["tasks"]["patches"]["dataset"] == "digits"  # untouched
    digits = movement.run(RunOptions(out=tmp_path / "o", **opts))
    assert {r["n_train"] for r in digits["runs"]} == {1497}


def test_missing_cifar10_is_reported_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_training(*args, **kwargs):
        raise AssertionError("a run started before the data were checked")

    monkeypatch.setattr(training, "train_run", no_training)
    _fake_cifar(tmp_path / "missing", skip="test_batch")
    for module in (movement, ablation):  # grokking comes first in their tasks
        with pytest.raises(ValueError, match="lacks the file test_batch"):
            module.run(
                RunOptions(
                    preset="smoke",
                    out=tmp_path / "o",
                    data_dir=tmp_path / "missing",
                    progress=False,
                )
            )


def test_cached_runs_survive_adding_a_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained: list[tuple[int, str]] = []
    real = training.train_run

    def counting(task, arm, seed, **kw):
        trained.append((seed, arm))
        return real(task, arm, seed, **kw)

    monkeypatch.setattr(training, "train_run", counting)
    monkeypatch.setattr(runs_lib, "forget_cached", lambda directory, cells: None)  # interrupted
    opts = dict(preset="smoke", out=tmp_path, progress=False, overrides=_small_movement())
    first = movement.run(RunOptions(seeds=(0,), **opts))
    second = movement.run(RunOptions(seeds=(0, 1), **opts))
    assert trained == [(0, "A"), (0, "G"), (1, "A"), (1, "G")]  # seed 0 read back, not retrained
    assert second["runs"][:2] == first["runs"]


def test_patches_runs_checkpoint_mid_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = training.train_run

    def spy(task, arm, seed, **kw):
        seen.append(kw["checkpoint_every"])
        return real(task, arm, seed, **kw)

    monkeypatch.setattr(training, "train_run", spy)
    patches.run(RunOptions(preset="smoke", out=tmp_path, progress=False, seeds=(0,)))
    assert seen and set(seen) == {patches.PRESETS["smoke"]["checkpoint_every"]} == {6}
    assert patches.PRESETS["paper"]["checkpoint_every"] == 2000


def test_gap_slope_is_least_squares_with_its_standard_error() -> None:
    from scipy import stats

    runs = []
    gaps = {100: [0.0, 2.0], 200: [1.0, 3.0], 400: [4.0, 4.0]}  # pp, two seeds per size
    for n, per_seed in gaps.items():
        for seed, gap in enumerate(per_seed):
            runs.append(
                {"fraction": n, "arm": "A", "seed": seed, "n_train": n, "final_val_acc": 0.5}
            )
            runs.append(
                {
                    "fraction": n,
                    "arm": "C",
                    "seed": seed,
                    "n_train": n,
                    "final_val_acc": 0.5 + gap / 100,
                }
            )
    got = patches.gap_slope(runs, "A", "C")
    x = np.log2([100, 100, 200, 200, 400, 400])
    y = np.array([0.0, 2.0, 1.0, 3.0, 4.0, 4.0])
    fit = stats.linregress(x, y)
    assert got["n"] == 6
    assert got["slope"] == pytest.approx(fit.slope) and got["se"] == pytest.approx(fit.stderr)
    assert patches.gap_grows([0.0, 1.0, 1.0]) and not patches.gap_grows([1.0, 0.5, 2.0])


def test_task_settings_are_checked_without_experiment_keys() -> None:
    grok = suite.task_config("grokking", "smoke")
    assert "arms" not in grok and "threshold" not in grok
    grokking.check_task(grok)  # no fake "arms" or "last_fraction" needed
    with pytest.raises(ValueError, match=r"trust_tau must be a positive finite number, got 0\.0"):
        grokking.check_task({**grok, "trust_tau": 0.0})
    with pytest.raises(ValueError, match="checkpoint_every must be an integer ≥ 0, got -1"):
        patches.check_task({**suite.task_config("patches", "smoke"), "checkpoint_every": -1})
    with pytest.raises(ValueError, match=r"beta2 must lie in \[0, 1\), got 1.5"):
        grokking.check_task({**grok, "betas": [0.9, 1.5]})
    with pytest.raises(ValueError, match=r"changes \['steps'\] repeat the preset's values"):
        suite.task_config("patches", "quick", steps=300)
    assert arms_lib.trust_radius({"trust_tau": 0.1, "d_model": 128, "n_heads": 4}) == (
        pytest.approx(0.1 * math.sqrt(32))
    )


def test_runs_made_in_separate_processes_assemble_into_the_whole_run(tmp_path: Path) -> None:
    """``grokking.assemble`` (docs/grokking_paper.sh runs each (seed, arm) in its own process)
    gives the records and summary of one process running them all; a part of another
    configuration and a missing run are refused."""
    whole = grokking.run(RunOptions(preset="smoke", out=tmp_path / "whole", progress=False))
    parts = [
        grokking.run(
            RunOptions(
                preset="smoke", out=tmp_path / arm, progress=False, overrides={"arms": [arm]}
            )
        )
        for arm in ("A", "C")
    ]
    merged = grokking.assemble(RunOptions(preset="smoke", out=tmp_path / "merged"), parts)
    assert merged["runs"] == whole["runs"]
    assert {k: v for k, v in merged["summary"].items() if k != "plots"} == {
        k: v for k, v in whole["summary"].items() if k != "plots"
    }
    assert (tmp_path / "merged" / "grokking" / "results.md").is_file()
    with pytest.raises(ValueError, match=r"no finished run for \(seed, arm\) \[\(0, 'C'\)\]"):
        grokking.assemble(RunOptions(preset="smoke", out=tmp_path / "m2"), parts[:1])
    other = {**parts[1], "config": {**parts[1]["config"], "lr": 1.0}}
    with pytest.raises(ValueError, match="not a run of this preset"):
        grokking.assemble(RunOptions(preset="smoke", out=tmp_path / "m3"), [parts[0], other])
