"""Hugging Face's ``Trainer`` with the library's optimizer: a tiny GPT-2 (built from a config,
nothing downloaded) with its QK products on Stiefel frames, trained by ``build_optimizer``'s
``RiemannianAdam``, checkpointed and resumed. ``Trainer`` loads the optimizer's state with
``map_location="cpu"``, so on a GPU the resume goes through a load that must move the moments
to the frames' device before it checks them. Skipped without ``transformers`` and
``accelerate`` (the ``hf`` extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from torch_port.convert import riemannian_attention  # noqa: E402
from torch_port.linalg import orthonormality_residual  # noqa: E402
from torch_port.nn import build_optimizer  # noqa: E402

VOCAB, STEPS = 61, 6
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class Tokens(torch.utils.data.Dataset):
    """Fixed random sequences, each its own label (causal language modelling)."""

    def __init__(self) -> None:
        self.x = torch.randint(1, VOCAB, (16, 12), generator=torch.Generator().manual_seed(3))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _train(out: Path, device: str, resume: str | None = None, stop: int | None = None):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=16,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg)
    riemannian_attention(model, "stiefel")
    model.to(device)
    opt = build_optimizer(model, lr=1e-2)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=stop or STEPS,
        per_device_train_batch_size=4,
        save_steps=3,
        save_strategy="steps",
        logging_strategy="no",
        report_to=[],
        use_cpu=device == "cpu",
        seed=0,
        data_seed=0,
        lr_scheduler_type="constant",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(), optimizers=(opt, None)
    )
    trainer.train(resume_from_checkpoint=resume)
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}, opt


@pytest.mark.parametrize("device", DEVICES)
def test_trainer_trains_frames_and_resumes_bitwise(tmp_path: Path, device: str) -> None:
    whole, opt = _train(tmp_path / "whole", device)
    frames = [p for g in opt.param_groups if g.get("geometry") for p in g["params"]]
    assert frames, "the converted model has frame groups"
    for p in frames:  # trained on St(d, r): moved, and still orthonormal
        assert float(orthonormality_residual(p.detach().double()).max()) < 1e-5
    interrupted = tmp_path / "interrupted"
    _train(interrupted, device, stop=3)
    checkpoint = interrupted / "checkpoint-3"
    assert (checkpoint / "optimizer.pt").is_file()
    resumed, _ = _train(interrupted, device, resume=str(checkpoint))
    assert whole.keys() == resumed.keys()
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name
