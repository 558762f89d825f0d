"""What only a CUDA device can check: Ray Train DDP on GPU workers (nccl across two devices, gloo with two ranks on
one), pretraining resumed bit for bit under train.deterministic, fp16 + GradScaler with LAMB, bf16 autocast, a
checkpoint moved from GPU to CPU, attention kernels on CUDA. Marked `gpu`: the default suite deselects them (pyproject
addopts); `benchmarks/gpu_check.sh` selects them (`-m gpu`) and runs them with the throughput table. The tests that
start Ray Train are marked `slow` too, as conftest requires of every test that does."""

import functools

import pytest
import torch
from checkpoint_helpers import assert_mid_run, verifying_checkpoints, verifying_steps
from finetune_helpers import single_rows, tiny_model_dir, write_csv
from test_loop import Checkpoints, KeywordTask, settings
from test_pretrain import (
    assert_same_weights,
    final_weights,
    prepared,  # noqa: F401 - a fixture (its own instance in this module)
    pretrain_overrides,
)

from albert_dist.config import load_config
from albert_dist.finetune.config import FinetuneJobConfig
from albert_dist.finetune.job import FINETUNE
from albert_dist.model import AlbertConfig, AlbertModel
from albert_dist.pretrain.config import PretrainJobConfig
from albert_dist.tokenizer.training import train_sentencepiece
from albert_dist.train import precision
from albert_dist.train.loop import Trainer, WorkerEnv

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")

# Two ranks either way: nccl refuses two ranks on one device, so a machine with one GPU runs them over gloo, half
# of the GPU each. The one that fits the machine is collected, so that a run of these tests skips nothing.
DDP = (
    pytest.param("nccl", 1.0, id="nccl-2-ranks-on-2-gpus")
    if torch.cuda.device_count() >= 2
    else pytest.param("gloo", 0.5, id="gloo-2-ranks-on-1-gpu")
)


@pytest.mark.slow
@pytest.mark.parametrize("backend, gpus_per_worker", [DDP])
def test_ray_train_fine_tunes_with_ddp_on_cuda(
    backend, gpus_per_worker, tmp_path, stdlib_corpus, ray_session, monkeypatch
):
    import ray.train.torch

    # the job has no backend setting: Ray Train picks nccl for GPU workers unless its TorchConfig says otherwise
    monkeypatch.setattr(
        ray.train.torch,
        "TorchTrainer",
        functools.partial(ray.train.torch.TorchTrainer, torch_config=ray.train.torch.TorchConfig(backend=backend)),
    )
    train_sentencepiece(stdlib_corpus, tmp_path / "tokenizer", 600, progress=lambda _: None)
    tiny_model_dir(tmp_path / "pretrained", tmp_path / "tokenizer")
    write_csv(tmp_path / "train.csv", single_rows(512, seed=1))
    cfg = FinetuneJobConfig.model_validate(
        {
            "run": {"name": "gpu", "output_dir": str(tmp_path / "runs")},
            "model": {"init_from": str(tmp_path / "pretrained")},
            "data": {"train": str(tmp_path / "train.csv"), "max_seq_length": 32},
            "finetune": {"epochs": 4},
            "scaling": {"num_workers": 2, "use_gpu": True, "cpus_per_worker": 0.5, "gpus_per_worker": gpus_per_worker},
            "train": {
                "precision": "bf16",
                "learning_rate": 1e-3,
                "batch_size": 16,
                "eval_every": 32,
                "checkpoint_every": 1000,
            },
            "tracking": {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"},
        }
    )
    outcome = FINETUNE.run(cfg)
    assert outcome.train_metrics["status"] == "completed"
    assert outcome.train_metrics["replicas_identical"] == 1.0
    assert outcome.metrics["dev_accuracy"] > 0.8


@pytest.mark.slow
def test_pretraining_resumed_on_cuda_ends_on_the_uninterrupted_runs_bits(prepared, ray_session):
    """train.deterministic on one GPU worker: a 20-step run relaunched with its step-20 checkpoint cut short (step
    10's is then the newest that verifies, where a run interrupted between the two resumes) trains steps 11-20 again
    and ends with the same loss, evaluation and weights, bit for bit."""
    from albert_dist.pretrain.job import PRETRAIN

    overrides = pretrain_overrides(prepared, "cuda-resume", 20) + [
        "scaling.num_workers=1",
        "scaling.use_gpu=true",
        "train.precision=bf16",
        "train.deterministic=true",
        "train.checkpoint_every=10",
        "train.eval_every=20",
        "train.keep_checkpoints=2",
    ]
    first = PRETRAIN.run(load_config(PretrainJobConfig, None, overrides)).train_metrics
    uninterrupted = final_weights(prepared / "cuda-resume")
    for checkpoint, step in verifying_checkpoints(prepared / "cuda-resume").items():
        if step > 10:
            state = checkpoint / "training_state.pt"
            state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    verifying = verifying_steps(prepared / "cuda-resume")

    again = PRETRAIN.run(load_config(PretrainJobConfig, None, overrides)).train_metrics
    assert_mid_run(int(again["resumed_from_step"]), verifying, 20)
    assert (again["step"], again["loss"], again["eval_loss"]) == (first["step"], first["loss"], first["eval_loss"])
    assert_same_weights(uninterrupted, final_weights(prepared / "cuda-resume"))


def test_fp16_grad_scaler_with_lamb_skips_overflowing_steps():
    trainer = Trainer(
        KeywordTask(overflow_at=frozenset({12, 13})),
        settings(precision="fp16", optimizer="lamb", max_nonfinite_steps=3),
        WorkerEnv(device=CUDA),
    )
    initial_scale = trainer.scaler.get_scale()
    result = trainer.fit()
    assert result["status"] == "completed" and result["eval_accuracy"] >= 0.85
    assert trainer.scaler.get_scale() < initial_scale  # backed off at the overflowing steps


def test_bf16_autocast_on_cuda_learns():
    assert precision.resolve_precision("auto", CUDA) == "bf16"
    result = Trainer(KeywordTask(), settings(precision="bf16"), WorkerEnv(device=CUDA)).fit()
    assert result["status"] == "completed" and result["eval_accuracy"] >= 0.85


def test_checkpoint_saved_on_gpu_resumes_on_cpu(tmp_path):
    saved = Checkpoints(tmp_path)
    Trainer(KeywordTask(), settings(optimizer="lamb"), WorkerEnv(device=CUDA, report=saved)).fit()
    resumed = Trainer(
        KeywordTask(), settings(optimizer="lamb"), WorkerEnv(resume_dir=tmp_path / "step20", print_fn=lambda _: None)
    )
    assert resumed.position.step == 20
    assert all(t.device.type == "cpu" for s in resumed.optimizer.state.values() for t in s.values())
    result = resumed.fit()
    assert result["status"] == "completed" and result["step"] == 40 and result["eval_accuracy"] >= 0.85


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
def test_attention_on_cuda_matches_cpu_with_and_without_padding(dtype, tolerance):
    torch.manual_seed(0)
    model = AlbertModel(
        AlbertConfig(
            vocab_size=100,
            embedding_size=32,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
        )
    ).eval()
    ids = torch.randint(5, 100, (4, 64))
    full = torch.ones(4, 64, dtype=torch.long)  # no padding: the mask-free SDPA path
    padded = (torch.arange(64) < torch.tensor([64, 40, 17, 3])[:, None]).long()
    with torch.no_grad():
        expected = [model(input_ids=ids, attention_mask=mask).last_hidden_state for mask in (full, padded)]
        model.to(CUDA)
        for mask, want in zip((full, padded), expected):
            with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
                got = model(input_ids=ids.to(CUDA), attention_mask=mask.to(CUDA)).last_hidden_state
            real = mask.bool()
            torch.testing.assert_close(got.float().cpu()[real], want[real], rtol=tolerance, atol=tolerance)
