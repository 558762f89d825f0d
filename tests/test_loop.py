"""The shared training loop in one process, without Ray: learning, exact resume, non-finite guard, checkpoints."""

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from albert_dist.config import TrainSection
from albert_dist.errors import CheckpointError
from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
from albert_dist.train import checkpointing
from albert_dist.train.loop import Trainer, TrainingTask, WorkerEnv


class KeywordTask(TrainingTask):
    """Label = whether the first token is above the vocabulary's middle: learnable in a few dozen steps."""

    best_metric, best_mode = "eval_accuracy", "max"

    def __init__(self, poison_from_step: int | None = None, overflow_at: frozenset[int] = frozenset()):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(5, 50, (256, 16), generator=g)
        self.y = (self.x[:, 0] > 27).long()
        self.poison_from_step, self.overflow_at = poison_from_step, overflow_at
        self.calls = 0

    def build_model(self):
        return AlbertForSequenceClassification(
            AlbertConfig(
                vocab_size=50,
                embedding_size=16,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                num_labels=2,
                classifier_dropout_prob=0.1,
            )
        )

    def loss(self, model, batch):
        self.calls += 1
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        loss = out.loss
        if self.poison_from_step is not None and self.calls > self.poison_from_step:
            loss = loss * float("nan")
        if self.calls in self.overflow_at:
            loss = loss * 1e38  # finite in fp32; its gradients overflow once the GradScaler multiplies them
        n = torch.tensor(float(len(batch["labels"])))
        return loss, {
            "loss_sum": out.loss.detach() * n,
            "n": n,
            "correct": (out.logits.argmax(-1) == batch["labels"]).sum(),
        }

    def summarize(self, s):
        return {"loss": s["loss_sum"] / s["n"], "accuracy": s["correct"] / s["n"]}

    def _rows(self, lo, hi, size):
        for i in range(lo, hi, size):
            yield {
                "input_ids": self.x[i : i + size],
                "attention_mask": torch.ones(size, 16, dtype=torch.long),
                "labels": self.y[i : i + size],
            }

    def train_batches(self, epoch, phase=0):
        return self._rows(0, 224, 16)

    def eval_batches(self):
        return self._rows(224, 256, 32)

    def save_model(self, model, directory):
        model.save_pretrained(directory)


def settings(**kw):
    base = dict(
        max_steps=40,
        warmup_steps=4,
        learning_rate=2e-3,
        optimizer="adamw",
        log_every=10,
        eval_every=20,
        checkpoint_every=20,
        precision="fp32",
    )
    return TrainSection(**{**base, **kw})


class Checkpoints:
    """Stands in for Ray's reporting: keeps a copy of each reported checkpoint by step."""

    def __init__(self, root: Path):
        self.root, self.reports = root, []

    def __call__(self, metrics, directory):
        self.reports.append(metrics)
        if directory is not None:
            shutil.copytree(directory, self.root / f"step{metrics['step']}")


def weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def test_learns_and_keeps_the_best_model(tmp_path):
    saved = Checkpoints(tmp_path)
    result = Trainer(KeywordTask(), settings(), WorkerEnv(report=saved, publish_to=tmp_path)).fit()
    assert result["status"] == "completed" and result["step"] == 40
    assert result["eval_accuracy"] >= 0.85
    assert [r["step"] for r in saved.reports] == [20, 40]
    assert (tmp_path / "model" / "model.safetensors").is_file()  # train.publish: best
    assert json.loads((tmp_path / "step40" / "manifest.json").read_text())["step"] == 40


def test_compiled_model_trains_and_saves_plain_weights(tmp_path):
    """`train.compile` runs the steps through torch.compile (opt-in: no faster on CPU, benchmarks/README.md); the
    run learns as the eager one does, and checkpoints and the best model hold the plain module's weights."""
    from safetensors.torch import load_file

    trainer = Trainer(
        KeywordTask(), settings(compile=True), WorkerEnv(report=Checkpoints(tmp_path), publish_to=tmp_path)
    )
    assert isinstance(trainer.wrapped, torch._dynamo.eval_frame.OptimizedModule)
    result = trainer.fit()
    assert result["status"] == "completed" and result["eval_accuracy"] >= 0.85
    saved, final = load_file(tmp_path / "step40" / "model" / "model.safetensors"), trainer.model.state_dict()
    assert saved and saved.keys() <= final.keys()  # no `_orig_mod.` prefixes
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, final[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, precision):
    saved = Checkpoints(tmp_path)
    full = Trainer(KeywordTask(), settings(precision=precision), WorkerEnv(report=saved))
    full.fit()
    resumed = Trainer(
        KeywordTask(), settings(precision=precision), WorkerEnv(resume_dir=tmp_path / "step20", print_fn=lambda s: None)
    )
    assert resumed.position.step == 20 and resumed.position.batch_in_epoch > 0
    resumed.fit()
    for (name, a), b in zip(weights(full).items(), weights(resumed).values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


class CountingTask(KeywordTask):
    """Counts its evaluations in its own state, which a resumed run must take back from the checkpoint."""

    def __init__(self):
        super().__init__()
        self.evaluations = 0

    def should_stop(self, eval_metrics):
        self.evaluations += 1
        return False

    def state(self):
        return {"evaluations": self.evaluations}

    def restore(self, state):
        self.evaluations = state["evaluations"]


def test_the_task_state_is_checkpointed_and_restored(tmp_path):
    full = CountingTask()
    Trainer(full, settings(eval_every=10), WorkerEnv(report=Checkpoints(tmp_path))).fit()
    resumed = CountingTask()
    Trainer(resumed, settings(eval_every=10), WorkerEnv(resume_dir=tmp_path / "step20", print_fn=lambda s: None)).fit()
    assert resumed.evaluations == full.evaluations == 4


class PhasedTask(KeywordTask):
    """Two phases, as a sequence-length schedule has: 12 steps of 8 rows of 8 tokens, then 12 of 16 rows of 16
    tokens; records the shape of every batch it hands out."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def phases(self):
        return [12, 12]

    def train_batches(self, epoch, phase=0):
        size, length = (8, 8) if phase == 0 else (16, 16)
        for batch in self._rows(0, 224, size):
            self.shapes.append((phase, epoch, *batch["input_ids"][:, :length].shape))
            yield {k: (v[:, :length] if v.dim() == 2 else v) for k, v in batch.items()}


def test_phases_switch_batches_at_their_boundary_and_resume_exactly_across_it(tmp_path):
    saved = Checkpoints(tmp_path)
    lines = []
    full_task = PhasedTask()
    full = Trainer(
        full_task,
        settings(max_steps=24, eval_every=8, checkpoint_every=8),
        WorkerEnv(report=saved, print_fn=lines.append),
    )
    full.fit()
    # phase 1: 12 batches of 8 x 8 (224 rows give 28 a pass, so one epoch); phase 2 starts its own epoch 0
    assert full_task.shapes[:12] == [(0, 0, 8, 8)] * 12 and full_task.shapes[12:] == [(1, 0, 16, 16)] * 12
    assert "step 12/24 | phase 2/2 begins" in lines
    # the checkpoint of step 8 resumes in phase 1 and crosses the boundary; the one of step 16 resumes in phase 2
    for step, phase_then in ((8, 0), (16, 1)):
        task = PhasedTask()
        resumed = Trainer(
            task,
            settings(max_steps=24, eval_every=8, checkpoint_every=8),
            WorkerEnv(resume_dir=tmp_path / f"step{step}", print_fn=lambda s: None),
        )
        assert (resumed.position.step, resumed.position.phase) == (step, phase_then)
        resumed.fit()
        assert task.shapes[-(24 - step) :] == full_task.shapes[step:]  # after the batches it skipped
        for (name, a), b in zip(weights(full).items(), weights(resumed).values()):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"resumed at {step}: {name}")


def test_phases_must_end_at_max_steps():
    with pytest.raises(ValueError, match="phases end at step 24, max_steps is 40"):
        Trainer(PhasedTask(), settings(), WorkerEnv())


def test_gradient_accumulation_counts_micro_batches(tmp_path):
    trainer = Trainer(
        KeywordTask(), settings(grad_accum_steps=2, max_steps=10, eval_every=10, checkpoint_every=10), WorkerEnv()
    )
    result = trainer.fit()
    # 10 steps x 2 micro-batches of 16 = 320 samples: one full epoch (14 batches) and 6 of the next
    assert (trainer.position.epoch, trainer.position.batch_in_epoch) == (1, 6)
    assert result["step"] == 10


def test_persistent_nan_stops_with_a_message(tmp_path):
    messages = []
    result = Trainer(
        KeywordTask(poison_from_step=5), settings(max_nonfinite_steps=3), WorkerEnv(print_fn=messages.append)
    ).fit()
    # non-finite from step 6; the device's count is read at the log interval (step 10), after 5 such steps
    assert result["status"] == "diverged" and result["step"] == 10
    assert "not finite for 5 consecutive steps" in result["message"]


def test_fp16_overflow_is_skipped_by_the_grad_scaler(monkeypatch):
    """fp16 + GradScaler is for GPUs (a config error on CPU); with that check lifted the same loop path runs on
    torch's CPU GradScaler and fp16 autocast, so an overflowing step is exercised where no GPU is."""
    from albert_dist.train import loop

    monkeypatch.setattr(loop.precision, "resolve_precision", lambda requested, device: requested)
    reports = []
    trainer = Trainer(
        KeywordTask(overflow_at=frozenset({12, 13})),
        settings(precision="fp16", max_nonfinite_steps=3),
        WorkerEnv(report=lambda metrics, checkpoint: reports.append(metrics)),
    )
    assert trainer.scaler is not None
    initial_scale = trainer.scaler.get_scale()
    result = trainer.fit()
    assert result["status"] == "completed" and result["step"] == 40  # two bad steps < max_nonfinite_steps
    assert trainer.scaler.get_scale() == initial_scale / 4  # halved at each skipped step, not grown in 40 steps
    assert sum(r.get("skipped_steps", 0) for r in reports) == 2
    assert result["accuracy"] > 0.9 and all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_corrupted_checkpoint_is_refused(tmp_path):
    saved = Checkpoints(tmp_path)
    Trainer(KeywordTask(), settings(max_steps=20), WorkerEnv(report=saved)).fit()
    weights_file = tmp_path / "step20" / "model" / "model.safetensors"
    data = bytearray(weights_file.read_bytes())
    data[-10] ^= 0xFF
    weights_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors does not match its checksum"):
        checkpointing.load_training_state(tmp_path / "step20")
    (tmp_path / "step20" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="incomplete write"):
        checkpointing.verify_manifest(tmp_path / "step20")


def test_resume_takes_the_newest_checkpoint_that_verifies(tmp_path):
    """Ray's recorded checkpoint, or a newer complete one it had not registered; a corrupted one is skipped."""
    from ray.train import Checkpoint

    from albert_dist.train.ray_runner import resume_directory

    def checkpoint(name: str, step: int) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "weights.bin").write_bytes(bytes([step]) * 16)
        checkpointing.write_manifest(directory, {"step": step})
        return directory

    assert resume_directory(None, tmp_path) is None  # a fresh run
    older, recorded = checkpoint("checkpoint_a", 10), checkpoint("checkpoint_b", 20)
    newer, newest = checkpoint("checkpoint_c", 30), checkpoint("checkpoint_d", 40)
    said = []
    assert resume_directory(Checkpoint.from_directory(str(recorded)), tmp_path, said.append) == newest
    (newest / "weights.bin").write_bytes(b"corrupted")
    assert resume_directory(Checkpoint.from_directory(str(recorded)), tmp_path, said.append) == newer
    assert "does not match its checksum" in said[-1]
    (newer / "manifest.json").unlink()
    (recorded / "weights.bin").write_bytes(b"corrupted")
    assert resume_directory(None, tmp_path, said.append) == older  # no record: the newest that verifies
    assert "checkpoint_b" in said[-1] and "does not match its checksum" in said[-1]
    (older / "weights.bin").write_bytes(b"corrupted")
    with pytest.raises(CheckpointError, match="every one failed its checksums"):  # Ray recorded one: damaged
        resume_directory(Checkpoint.from_directory(str(recorded)), tmp_path, said.append)
    # no record and none complete: the first checkpoint was cut off by a crash, the run starts again
    assert resume_directory(None, tmp_path, said.append) is None
    assert "starts from the beginning" in said[-1]


def test_fingerprint_keeps_what_decides_the_training_and_names_its_changes():
    settings = {
        "train.learning_rate": 1e-3,
        "train.max_steps": 100,
        "model.hidden_size": 64,
        "run.seed": 0,
        "train.log_every": 10,
        "train.checkpoint_every": 50,
        "tracking.experiment": "x",
        "scaling.cpus_per_worker": 0.5,
        "scaling.num_workers": 2,
        "data.cache": "auto",
        "run.name": "a",
    }
    recorded = checkpointing.fingerprint(settings, "d" * 64)
    assert set(recorded["settings"]) == {
        "train.learning_rate",
        "train.max_steps",
        "model.hidden_size",
        "run.seed",
        "scaling.num_workers",
    }
    # where and how often it logs, checkpoints and runs may change; what is trained may not
    moved = {
        **settings,
        "train.log_every": 1,
        "tracking.experiment": "y",
        "scaling.cpus_per_worker": 1.0,
        "data.cache": "stream",
        "run.name": "b",
    }
    assert checkpointing.fingerprint_changes(recorded, checkpointing.fingerprint(moved, "d" * 64)) == []
    changed = checkpointing.fingerprint({**settings, "train.learning_rate": 2e-3, "scaling.num_workers": 4}, "e" * 64)
    assert checkpointing.fingerprint_changes(recorded, changed) == [
        "scaling.num_workers 2 → 4",
        "train.learning_rate 0.001 → 0.002",
        "the prepared data (digest dddddddddddd → eeeeeeeeeeee)",
    ]
    assert checkpointing.fingerprint_changes(None, changed) == []  # a checkpoint from before fingerprints
    # a setting added since the checkpoint was written: unchanged at its default, a change at another value
    defaults = {**settings, "train.deterministic": False, "train.new_knob": 1}
    newer = {**settings, "train.new_knob": 1}
    assert checkpointing.fingerprint_changes(recorded, checkpointing.fingerprint(newer, "d" * 64, defaults)) == []
    assert checkpointing.fingerprint_changes(
        recorded, checkpointing.fingerprint({**newer, "train.new_knob": 2}, "d" * 64, defaults)
    ) == ["train.new_knob 1 → 2"]
    assert checkpointing.fingerprint_changes(recorded, checkpointing.fingerprint(newer, "d" * 64)) == [
        "train.new_knob (unset) → 1"  # without the job's defaults nothing tells what the checkpoint had
    ]


def test_a_drain_notice_checkpoints_the_step_reached_once_and_is_logged(tmp_path):
    """A node told to drain at step 7, checked every 5 steps: the checkpoint of step 10 is written (between the
    regular ones of 20 and 40), once however long the notice stands, and the event reaches MLflow's metrics; a
    resume from it continues the run exactly."""
    saved, logged, lines = Checkpoints(tmp_path), [], []
    trainer = Trainer(
        KeywordTask(),
        settings(drain_check_every=5),
        WorkerEnv(
            report=saved, log_metrics=lambda metrics, step: logged.append((metrics, step)), print_fn=lines.append
        ),
    )
    trainer.env.draining = lambda: trainer.position.step >= 7
    trainer.fit()
    assert sorted(int(p.name[4:]) for p in tmp_path.glob("step*")) == [10, 20, 40]
    assert [(m, s) for m, s in logged if "drain_notice_step" in m] == [({"drain_notice_step": 10.0}, 10)]
    assert sum("drain notice" in line for line in lines) == 1
    full = Trainer(KeywordTask(), settings(), WorkerEnv())
    full.fit()
    resumed = Trainer(KeywordTask(), settings(), WorkerEnv(resume_dir=tmp_path / "step10", print_fn=lambda s: None))
    assert resumed.position.step == 10
    resumed.fit()
    for (name, a), b in zip(weights(full).items(), weights(resumed).values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_the_slots_of_a_global_batch_are_shared_out_whole_among_any_number_of_workers_up_to_their_count():
    from albert_dist.train.feed import slot_range

    for slots in range(1, 9):
        for workers in range(1, slots + 1):
            held = [slot_range(rank, workers, slots) for rank in range(workers)]
            assert [slot for part in held for slot in part] == list(range(slots))  # consecutive, each once
            assert {len(part) for part in held} <= {slots // workers, slots // workers + 1}
    with pytest.raises(ValueError, match="3 workers for 2 slots"):
        slot_range(0, 3, 2)


def test_the_console_says_every_ranks_share_of_the_slots_when_they_differ():
    from albert_dist.train.feed import slot_shares

    assert slot_shares(2, 4) == "each trains 2"
    assert slot_shares(2, 3) == "rank 0 trains 1, rank 1 trains 2"
    assert slot_shares(3, 5) == "rank 0 trains 1, ranks 1-2 train 2"
    assert slot_shares(1, 3) == "each trains 3"


class SlowEvaluationTask(KeywordTask):
    """Each evaluation takes at least `EVAL_PAUSE_S` (a pause before its batches)."""

    def eval_batches(self):
        time.sleep(EVAL_PAUSE_S)
        return super().eval_batches()


EVAL_PAUSE_S, REPORT_PAUSE_S = 0.4, 0.3


def test_the_loop_says_where_its_time_went_and_counts_the_tokens_it_trained(tmp_path):
    """Evaluation and the reports that carry checkpoints are timed apart from the steps; the tokens are every
    attention-masked position trained on."""
    lines, logged = [], {}

    def slow_report(metrics, directory):
        time.sleep(REPORT_PAUSE_S)

    env = WorkerEnv(report=slow_report, print_fn=lines.append, log_metrics=lambda m, step: logged.update(m))
    result = Trainer(SlowEvaluationTask(), settings(), env).fit()
    wall = result["loop_wall_s"]
    evaluations, reports = 2, 2  # steps 20 and 40 evaluate and checkpoint
    assert result["tokens_seen"] == 40 * 16 * 16  # steps × batch × sequence length, every position attended
    assert logged["tokens_seen"] == result["tokens_seen"]
    assert evaluations * EVAL_PAUSE_S <= result["evaluation_share"] * wall < evaluations * EVAL_PAUSE_S + 1.0
    assert reports * REPORT_PAUSE_S <= result["checkpoint_share"] * wall < reports * REPORT_PAUSE_S + 1.0
    line = next(line for line in lines if "loop time" in line)
    assert f"evaluation {result['evaluation_share']:.1%}" in line and "10240 tokens" in line


class CollapsingTask(KeywordTask):
    """A metric that leaves its baseline of 0.05, peaks at step 20, then falls back onto it."""

    plateau_warning_after = 0.0
    readings = iter([0.10, 0.12, 0.055, 0.05])

    def plateau(self, eval_metrics):
        return "held-out accuracy", next(self.readings), 0.05


def test_a_model_that_falls_back_onto_its_baseline_is_warned_of_once_naming_its_peak():
    lines = []
    Trainer(CollapsingTask(), settings(eval_every=10), WorkerEnv(print_fn=lines.append)).fit()
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1  # not again at step 40, and no "learned nothing" warning for a model that learned
    assert "0.055 fell back" in warnings[0] and "from 0.120 at step 20" in warnings[0]
    assert "(step 30/40)" in warnings[0] and "learning_rate" in warnings[0]
