"""The GPU path, made right on the CPU: every generator a rank draws from is in its checkpoint, `train.deterministic`
requests deterministic kernels, the training step never reads a value back from the device, and the step, both
optimizers, a restored checkpoint and packed batches never mix devices."""

import shutil
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from albert_dist.config import TrainSection
from albert_dist.model import AlbertConfig, AlbertForPreTraining
from albert_dist.train import checkpointing, loop
from albert_dist.train.loop import Trainer, WorkerEnv

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from gpu_check import TINY, ClassifyTask, PretrainingBatchesTask  # the GPU check's own tasks


def settings(**kw):
    base = dict(
        max_steps=6,
        warmup_steps=1,
        learning_rate=1e-3,
        optimizer="adamw",
        log_every=3,
        eval_every=6,
        checkpoint_every=6,
        precision="fp32",
    )
    return TrainSection(**{**base, **kw})


# ------------------------------------------------------------------------------------------------ generators


class FakeCudaGenerators:
    """torch.cuda's generator functions over a state per device, for a CPU-only torch."""

    def __init__(self):
        self.states, self.restored = {}, []

    def get_rng_state(self, device="cuda"):
        return self.states.setdefault(str(device), torch.randint(0, 255, (16,), dtype=torch.uint8))

    def set_rng_state(self, state, device="cuda"):
        self.restored.append((str(device), state.clone()))


def test_checkpoint_holds_each_ranks_cuda_generator(tmp_path, monkeypatch):
    fake = FakeCudaGenerators()
    monkeypatch.setattr(torch.cuda, "get_rng_state", fake.get_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", fake.set_rng_state)
    task, cuda = ClassifyTask(), torch.device("cuda:0")
    written = tmp_path / "ckpt"
    env = WorkerEnv(device=cuda, report=lambda metrics, d: d and shutil.copytree(d, written))
    model = task.build_model()
    cpu_state = torch.get_rng_state()
    checkpointing.CheckpointManager(task, env, every=1).report({}, model, {"step": 1, "epoch": 0})
    saved = checkpointing.load_training_state(written)["rng_states"][0]
    assert torch.equal(saved["cuda"], fake.states["cuda:0"]) and torch.equal(saved["cpu"], cpu_state)

    torch.manual_seed(1234)  # both generators move on; the restore must bring both back
    checkpointing.CheckpointManager(task, env, every=1).restore(model, written)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    assert [(d, s.tolist()) for d, s in fake.restored] == [("cuda:0", fake.states["cuda:0"].tolist())]


def test_checkpoint_without_cuda_state_restores_the_cpu_generator():
    """A checkpoint from a CPU run (or one holding the CPU generator only) resumes on any device."""
    state = torch.get_rng_state()
    torch.manual_seed(99)
    checkpointing.set_rng_state(state, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), state)


def test_deterministic_requests_deterministic_kernels(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        Trainer(ClassifyTask(), settings(), WorkerEnv())
        assert not torch.are_deterministic_algorithms_enabled()
        Trainer(ClassifyTask(), settings(deterministic=True), WorkerEnv())
        assert torch.are_deterministic_algorithms_enabled()
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(before)


# ------------------------------------------------------------------------------------------ host reads


class HostReads(TorchDispatchMode):
    """Records every op that hands a tensor's value to the host: `.item()`, `bool()`, `float()`, `int()` all end
    in `_local_scalar_dense`. On a GPU each one waits for every kernel queued before it."""

    def __init__(self):
        super().__init__()
        self.where: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.where.append(_caller())
        return func(*args, **(kwargs or {}))


def _caller() -> str:
    frames = [f for f in traceback.extract_stack() if "albert_dist" in f.filename or "torch" in f.filename]
    return " < ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in reversed(frames[-4:]))


@pytest.mark.parametrize(
    "task_class, precision, optimizer",
    [
        (ClassifyTask, "fp32", "adamw"),
        (ClassifyTask, "fp16", "lamb"),
        (PretrainingBatchesTask, "bf16", "lamb"),
        (PretrainingBatchesTask, "fp16", "adamw"),
    ],
)
def test_training_steps_read_nothing_back_from_the_device(monkeypatch, task_class, precision, optimizer):
    """Between log intervals the host never waits for the device: no scalar read, no `.tolist()`/`.numpy()`/
    `.cpu()` in the step, the model's forward, the loss, the optimizer or the GradScaler. (fp16 + GradScaler is for
    GPUs; the check that refuses it on CPU is lifted, as in test_loop, to run the same path.)"""
    monkeypatch.setattr(loop.precision, "resolve_precision", lambda requested, device: requested)
    reads: list[str] = []
    in_step = False
    for name in ("tolist", "numpy", "cpu"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if in_step:
                reads.append(f"{_name}: {_caller()}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    trainer = Trainer(task_class(), settings(precision=precision, optimizer=optimizer, max_grad_norm=1.0), WorkerEnv())
    steps = 0
    train_step = trainer._train_step

    def watched_step(*args):
        nonlocal steps, in_step
        steps, in_step = steps + 1, True
        try:
            with HostReads() as mode:
                train_step(*args)
        finally:
            in_step = False
        reads.extend(mode.where)

    trainer._train_step = watched_step
    result = trainer.fit()
    assert result["status"] == "completed" and steps == 6
    assert reads == [], reads[:5]
    assert np.isfinite(result["loss"])


# -------------------------------------------------------------------------------------------- devices


def test_packed_batches_and_the_model_stay_on_the_device():
    """meta stands in for a GPU: a tensor made on the CPU meeting the device's tensors raises, as on CUDA (a 0-dim
    CPU tensor excepted, there as here)."""
    meta = torch.device("meta")
    batch = {k: v.to(meta) for k, v in PretrainingBatchesTask().batches[0].items()}
    model = AlbertForPreTraining(AlbertConfig(**TINY)).to(meta)
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        sentence_order_label=batch["sentence_order_label"],
        position_ids=batch["position_ids"],
        sequence_ids=batch["sequence_ids"],
        cls_positions=batch["cls_positions"],
    )
    out.loss.backward()
    assert out.sop_logits.device == meta and all(p.grad.device == meta for p in model.sop_classifier.parameters())


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")  # meta holds no values
@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_step_optimizer_and_restored_checkpoint_stay_on_the_device(tmp_path, optimizer):
    """A checkpoint written on the CPU is resumed on the device and trained on: weights, optimizer state, the
    step's statistics and counters all live there. meta also has no values, so any read back to the host in the
    step raises."""
    written = tmp_path / "ckpt"
    Trainer(
        ClassifyTask(),
        settings(optimizer=optimizer, max_steps=2, checkpoint_every=2),
        WorkerEnv(report=lambda metrics, d: d and shutil.copytree(d, written)),
    ).fit()
    meta = torch.device("meta")
    trainer = Trainer(ClassifyTask(), settings(optimizer=optimizer), WorkerEnv(device=meta, resume_dir=written))
    assert trainer.position.step == 2
    window = {}
    trainer._train_step(iter(trainer.task.batches), window)
    trainer._train_step(iter(trainer.task.batches), window)
    tensors = [
        *trainer.model.parameters(),
        trainer.nonfinite_run,
        trainer.nonfinite_longest,
        *(
            t
            for state in trainer.optimizer.state.values()
            for t in state.values()
            if isinstance(t, torch.Tensor) and t.dim()
        ),
    ]
    assert {t.device for t in tensors} == {meta}
    assert {v.device for v in window.values() if isinstance(v, torch.Tensor)} == {meta}
