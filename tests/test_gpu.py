"""What only a CUDA device can check: Ray Train with nccl, fp16 + GradScaler with LAMB, bf16 autocast, a checkpoint
moved from GPU to CPU, attention kernels on CUDA. Marked `gpu`: the default suite deselects them (pyproject addopts);
`benchmarks/gpu_check.sh` selects them (`-m gpu`) and runs them with the throughput table."""

import pytest
import torch
from finetune_helpers import single_rows, tiny_model_dir, write_csv
from test_loop import Checkpoints, KeywordTask, settings

from albert_dist.finetune.config import FinetuneJobConfig
from albert_dist.finetune.job import FINETUNE
from albert_dist.model import AlbertConfig, AlbertModel
from albert_dist.tokenizer.training import train_sentencepiece
from albert_dist.train import precision
from albert_dist.train.loop import Trainer, WorkerEnv

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")


def test_ray_train_fine_tunes_over_nccl_on_cuda(tmp_path, stdlib_corpus, ray_session):
    train_sentencepiece(stdlib_corpus, tmp_path / "tokenizer", 600, progress=lambda _: None)
    tiny_model_dir(tmp_path / "pretrained", tmp_path / "tokenizer")
    write_csv(tmp_path / "train.csv", single_rows(512, seed=1))
    workers = min(2, torch.cuda.device_count())  # nccl refuses two ranks on one device
    cfg = FinetuneJobConfig.model_validate(
        {
            "run": {"name": "gpu", "output_dir": str(tmp_path / "runs")},
            "model": {"init_from": str(tmp_path / "pretrained")},
            "data": {"train": str(tmp_path / "train.csv"), "max_seq_length": 32},
            "finetune": {"epochs": 4},
            "scaling": {"num_workers": workers, "use_gpu": True, "cpus_per_worker": 0.5},
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
