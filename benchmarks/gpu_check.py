"""What a GPU decides, checked in one process without Ray: the `Trainer` the Ray workers run, with the losses of the
pretraining (`PretrainingTask.loss`: MLM + SOP, padded and packed) and distillation tasks, sequence classification
and `predict`'s inference, in bf16 and in fp16 with the GradScaler, with AdamW and LAMB; an exact resume with
dropout on under train.deterministic; a checkpoint written on the device read on the CPU; DDP with two ranks.

Ends with one table and one PASS/FAIL line per item; exits non-zero when any fails. `benchmarks/gpu_check.sh` runs
it on CUDA (and refuses to without a GPU); `--device cpu` runs the same code on the CPU (bf16 and fp32 only, DDP
over gloo), which CI does so that this script cannot rot unseen.

    python benchmarks/gpu_check.py --device cuda
    python benchmarks/gpu_check.py --device cpu --only finetune    # one item
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from albert_dist.config import TrainSection
from albert_dist.data.masking import MaskingCollator
from albert_dist.data.packing import pack_batch
from albert_dist.finetune import inference
from albert_dist.finetune.distill import DistillationModel, distillation_loss
from albert_dist.model import AlbertConfig, AlbertForPreTraining, AlbertForSequenceClassification
from albert_dist.pretrain.task import PretrainingTask
from albert_dist.train.loop import Trainer, TrainingTask, WorkerEnv

TINY = dict(
    vocab_size=60,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    hidden_dropout_prob=0.1,
)


class ClassifyTask(TrainingTask):
    """Padded rows of varying length, label = whether the first token is above the vocabulary's middle (learnable
    in a few dozen steps); batches are built once, so a step reads no host data."""

    best_metric, best_mode = "eval_accuracy", "max"

    def __init__(self, batches: int = 14):
        g = torch.Generator().manual_seed(0)
        self.batches = []
        for _ in range(batches + 2):
            x = torch.randint(5, 60, (16, 16), generator=g)
            mask = (torch.arange(16)[None] < torch.randint(6, 17, (16, 1), generator=g)).long()
            self.batches.append(
                {
                    "input_ids": x * mask,
                    "attention_mask": mask,
                    "token_type_ids": torch.zeros_like(x),
                    "labels": (x[:, 0] > 32).long(),
                }
            )

    def build_model(self):
        return AlbertForSequenceClassification(AlbertConfig(**TINY, num_labels=2, classifier_dropout_prob=0.1))

    def loss(self, model, batch):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        return out.loss, self.statistics(out.logits, out.loss, batch)

    def statistics(self, logits, loss, batch):
        n = len(batch["labels"])
        return {"loss_sum": loss.detach() * n, "n": float(n), "correct": (logits.argmax(-1) == batch["labels"]).sum()}

    def summarize(self, sums):
        return {"loss": sums["loss_sum"] / sums["n"], "accuracy": sums.get("correct", 0.0) / sums["n"]}

    def train_batches(self, epoch, phase=0):
        return iter(self.batches[:-2])

    def eval_batches(self):
        return iter(self.batches[-2:])

    def save_model(self, model, directory):
        model.save_pretrained(directory)


class PretrainingBatchesTask(ClassifyTask):
    """MLM + SOP through `PretrainingTask.loss` on `MaskingCollator`'s batches, packed by `pack_batch` or padded."""

    best_metric, best_mode = "eval_loss", "min"
    loss = PretrainingTask.loss
    summarize = PretrainingTask.summarize

    def __init__(self, packed: bool = True, batches: int = 6):
        self.collator = MaskingCollator(vocab_size=60, pad_id=0, mask_id=4, special_ids=[1, 2, 3])
        rng = np.random.default_rng(0)
        self.batches = []
        for _ in range(batches + 2):
            rows = [rng.integers(5, 60, rng.integers(6, 30)) for _ in range(8)]
            masked = self.collator(
                {
                    "input_ids": rows,
                    "token_type_ids": [np.zeros_like(r) for r in rows],
                    "sop_label": rng.integers(0, 2, 8),
                },
                rng,
            )
            self.batches.append(pack_batch(masked, capacity=32, pad_id=0) if packed else masked)

    def build_model(self):
        return AlbertForPreTraining(AlbertConfig(**TINY))


class DistillBatchesTask(ClassifyTask):
    """`DistillationModel` (a two-layer teacher, a one-layer student) trained on `distillation_loss`."""

    def build_model(self):
        torch.manual_seed(1)
        teacher = AlbertForSequenceClassification(AlbertConfig(**TINY, num_labels=2))
        student = AlbertForSequenceClassification(AlbertConfig(**{**TINY, "num_hidden_layers": 1}, num_labels=2))
        return DistillationModel(student, teacher, match_hidden=True)

    def loss(self, model, batch):
        student, teacher, hidden = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss, _, _ = distillation_loss(student, teacher, batch["labels"], temperature=2.0, alpha=0.5)
        loss = loss + hidden
        return loss, self.statistics(student, loss, batch)

    def save_model(self, model, directory):
        model.student.save_pretrained(directory)


def settings(**kw) -> TrainSection:
    base = dict(
        max_steps=40,
        warmup_steps=4,
        learning_rate=2e-3,
        optimizer="adamw",
        log_every=10,
        eval_every=20,
        checkpoint_every=20,
        precision="bf16",
    )
    return TrainSection(**{**base, **kw})


def quiet(device: torch.device, **kw) -> WorkerEnv:
    return WorkerEnv(device=device, print_fn=lambda line: None, **kw)


# ------------------------------------------------------------------------------------------------------ items


def train_item(task_factory: Callable[[], TrainingTask], check: Callable[[dict], bool], **kw):
    def item(device: torch.device, workdir: Path) -> str:
        result = Trainer(task_factory(), settings(**kw), quiet(device)).fit()
        shown = {
            k: round(v, 3) for k, v in result.items() if k in ("loss", "eval_loss", "eval_accuracy", "skipped_steps")
        }
        if result["status"] != "completed" or not check(result):
            raise AssertionError(f"{result['status']} {shown}")
        return f"{shown}"

    return item


def learned(result: dict) -> bool:
    return result["eval_accuracy"] >= 0.85


def trained(result: dict) -> bool:
    """Finite losses, and no step of the last log window skipped (fp16: the GradScaler found its scale)."""
    return bool(np.isfinite(result["loss"]) and np.isfinite(result["eval_loss"]) and result["skipped_steps"] == 0)


def saving(device: torch.device, directory: Path, **kw) -> WorkerEnv:
    """An environment that keeps a copy of each checkpoint under `directory`/step<N>, as Ray's storage would."""
    return quiet(
        device, report=lambda metrics, d: d and shutil.copytree(d, directory / f"step{metrics['step']}") and None, **kw
    )


def exact_resume(device: torch.device, workdir: Path) -> str:
    """Dropout on, train.deterministic: a run resumed from its step-20 checkpoint ends on the weights of the run
    that was not interrupted."""
    kw = dict(deterministic=True)
    try:
        whole = Trainer(ClassifyTask(), settings(**kw), saving(device, workdir))
        whole.fit()
        resumed = Trainer(ClassifyTask(), settings(**kw), quiet(device, resume_dir=workdir / "step20"))
        resumed.fit()
    finally:  # a worker process keeps it for its one run; here the other items follow
        torch.use_deterministic_algorithms(False)
    differing = [
        name
        for (name, a), b in zip(whole.model.named_parameters(), resumed.model.parameters())
        if not torch.equal(a, b)
    ]
    if differing:
        raise AssertionError(f"{len(differing)} tensors differ, e.g. {differing[0]}")
    return "weights bit-identical to the uninterrupted run"


def checkpoint_to_cpu(device: torch.device, workdir: Path) -> str:
    Trainer(ClassifyTask(), settings(), saving(device, workdir)).fit()
    resumed = Trainer(
        ClassifyTask(), settings(precision="fp32"), quiet(torch.device("cpu"), resume_dir=workdir / "step20")
    )
    states = {t.device.type for s in resumed.optimizer.state.values() for t in s.values()}
    result = resumed.fit()
    if resumed.position.step != 40 or states != {"cpu"} or not learned(result):
        raise AssertionError(f"step {resumed.position.step}, optimizer state on {states}, {result}")
    return f"written on {device.type}, resumed on cpu to step 40, eval_accuracy {result['eval_accuracy']:.3f}"


def predict(device: torch.device, workdir: Path) -> str:
    """The inference `predict` runs, on the device in bf16, against fp32 on the CPU."""
    trainer = Trainer(ClassifyTask(), settings(), quiet(device))
    trainer.fit()
    trainer.model.save_pretrained(workdir / "predict")
    batches = ClassifyTask().batches[-2:]
    on_device = inference.predict_logits(
        AlbertForSequenceClassification.from_pretrained(workdir / "predict").to(device), batches, precision="bf16"
    )
    on_cpu = inference.predict_logits(
        AlbertForSequenceClassification.from_pretrained(workdir / "predict"), batches, precision="fp32"
    )
    agree = float((on_device.argmax(-1) == on_cpu.argmax(-1)).mean())
    gap = float(np.abs(on_device - on_cpu).max())
    if agree < 0.95 or gap > 0.1:
        raise AssertionError(f"labels agree {agree:.2f}, logits differ by up to {gap:.3f}")
    return f"bf16 on {device.type} vs fp32 on cpu: labels agree {agree:.2f}, max |Δlogit| {gap:.3f}"


def host_syncs(device: torch.device, workdir: Path) -> str:
    """Training steps under CUDA's sync debug mode: neither fine-tuning's nor pretraining's (packed) may wait for the
    device once (tests/test_gpu_path.py catches the ops that would on the CPU; this sees the CUDA kernels that do)."""
    import warnings

    counts = {}
    for name, task in (("finetune", ClassifyTask()), ("pretrain packed", PretrainingBatchesTask())):
        trainer = Trainer(task, settings(), quiet(device))
        batches, window = trainer._micro_batches(), {}
        trainer._train_step(batches, window)  # the first step allocates and initialises
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(4):
                    trainer._train_step(batches, window)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts[name] = sum("synchroniz" in str(w.message) for w in caught) / 4
    if any(counts.values()):
        raise AssertionError(f"host syncs per step: {counts}")
    return f"host syncs per step: {counts}"


def _ddp_rank(rank: int, world_size: int, backend: str, device_kind: str, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}") if device_kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    wrap = (
        (lambda m: DistributedDataParallel(m, device_ids=[device.index]))
        if device.type == "cuda"
        else DistributedDataParallel
    )
    result = Trainer(
        ClassifyTask(),
        settings(max_steps=20, eval_every=10),
        WorkerEnv(rank=rank, world_size=world_size, device=device, wrap_model=wrap, print_fn=lambda line: None),
    ).fit()
    if rank == 0:
        Path(out).write_text(f"{result['status']} {result['replicas_identical']} {result['eval_accuracy']}")
    dist.destroy_process_group()


def ddp_item(backend: str) -> Callable[[torch.device, Path], str]:
    def item(device: torch.device, workdir: Path) -> str:
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = workdir / f"ddp-{backend}.txt"
        mp.spawn(_ddp_rank, args=(2, backend, device.type, port, str(out)), nprocs=2, join=True)
        status, identical, accuracy = out.read_text().split()
        if status != "completed" or float(identical) != 1.0:
            raise AssertionError(f"{status}, replicas identical {identical}")
        gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        where = ("two ranks on one GPU" if gpus == 1 else f"two ranks on {min(2, gpus)} GPUs") if gpus else "CPU"
        return f"{backend} ({where}): replicas identical, eval_accuracy {float(accuracy):.3f}"

    return item


def items(device: torch.device) -> dict[str, Callable[[torch.device, Path], str]]:
    """The check's items for `device`: fp16 (GradScaler) and nccl only where a GPU is."""
    cuda = device.type == "cuda"
    found = {
        "pretrain padded bf16 adamw": train_item(lambda: PretrainingBatchesTask(packed=False), trained),
        "pretrain packed bf16 lamb": train_item(PretrainingBatchesTask, trained, optimizer="lamb"),
        "finetune bf16 adamw": train_item(ClassifyTask, learned),
        "finetune bf16 lamb": train_item(ClassifyTask, trained, optimizer="lamb"),
        "distill bf16 adamw": train_item(DistillBatchesTask, trained),
        "predict bf16": predict,
        "exact resume (dropout, deterministic)": exact_resume,
        "checkpoint to cpu": checkpoint_to_cpu,
    }
    if cuda:
        found.update(
            {
                "pretrain packed fp16 adamw": train_item(PretrainingBatchesTask, trained, precision="fp16"),
                "pretrain padded fp16 lamb": train_item(
                    lambda: PretrainingBatchesTask(packed=False), trained, precision="fp16", optimizer="lamb"
                ),
                "finetune fp16 adamw": train_item(ClassifyTask, learned, precision="fp16"),
                "finetune fp16 lamb": train_item(ClassifyTask, trained, precision="fp16", optimizer="lamb"),
                "distill fp16 adamw": train_item(DistillBatchesTask, trained, precision="fp16"),
                "host syncs in the step": host_syncs,
            }
        )
    if cuda and torch.cuda.device_count() >= 2:
        found["ddp 2 ranks nccl"] = ddp_item("nccl")
    found["ddp 2 ranks gloo (not nccl)"] = ddp_item("gloo")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--only", default="", help="run only the items whose name contains this")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"FAIL: no CUDA device visible to torch {torch.__version__} (CUDA build: {torch.version.cuda})")
        return 1
    device = torch.device(args.device)
    chosen = {name: item for name, item in items(device).items() if args.only in name}
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for index, (name, item) in enumerate(chosen.items()):
            start, workdir = time.perf_counter(), Path(tmp) / str(index)
            workdir.mkdir()
            try:
                detail, ok = item(device, workdir), True
            except Exception as err:  # one item's failure is reported, the others still run
                detail, ok = f"{type(err).__name__}: {err}".splitlines()[0][:160], False
                traceback.print_exc()
            rows.append((name, ok, time.perf_counter() - start, detail))
            print(f"{'PASS' if ok else 'FAIL'}  {name}  ({rows[-1][2]:.1f}s)", flush=True)
    width = max(len(name) for name, *_ in rows)
    print(f"\n{'item':<{width}}  result  seconds  detail")
    for name, ok, seconds, detail in rows:
        print(f"{name:<{width}}  {'PASS' if ok else 'FAIL':<6}  {seconds:7.1f}  {detail}")
    failed = [name for name, ok, *_ in rows if not ok]
    print(
        f"\n{'FAIL' if failed else 'PASS'}: {len(rows) - len(failed)}/{len(rows)} items on {device.type}"
        + (f" ({torch.cuda.get_device_name(0)})" if device.type == "cuda" else "")
    )
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
