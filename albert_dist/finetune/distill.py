"""`albert-dist distill`: a fine-tuned teacher (frozen, eval mode) trains a smaller ALBERT student.

loss = α·T²·KL(softmax(s/T) ‖ softmax(t/T)) + (1−α)·CE(s, y) + β·MSE(proj(h_s), h_t)

The teacher's logits (and hidden states) are computed inside the training loop, in the same forward pass as
the student's, on the same batch and precision: nothing is precomputed or stored. Hidden states are matched
layer to layer, student layer i (1-based) → teacher layer round(i·Lt/Ls), through one learned linear projection
when the hidden sizes differ; the projection is training-only (`save_training_only`): kept beside the student in
checkpoints, for exact resume, never in the published model.

When the student keeps the teacher's hidden size, ALBERT's sharing makes initialising it from the teacher free:
the same shared groups, applied fewer times. A student of another width can instead start from a separately
pretrained smaller ALBERT with the same vocabulary (`student.init_from`, e.g. albert_chinese_tiny under an
albert_chinese_base teacher): logits are distilled whatever the widths, hidden states through the projection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from albert_dist.data import batching
from albert_dist.errors import ConfigError
from albert_dist.finetune import entities, inference, job, qa_task, token_task
from albert_dist.finetune.config import DistillJobConfig
from albert_dist.finetune.qa_task import QuestionAnsweringSpec, QuestionAnsweringTask
from albert_dist.finetune.task import ClassificationSpec, SequenceClassificationTask
from albert_dist.finetune.token_task import TokenClassificationSpec, TokenClassificationTask
from albert_dist.model import (
    IGNORE_INDEX,
    AlbertConfig,
    AlbertForQuestionAnswering,
    AlbertForSequenceClassification,
    AlbertForTokenClassification,
    AlbertQuestionAnsweringOutput,
)
from albert_dist.model.checkpoint import CONFIG_NAME, load_config
from albert_dist.storage import publish_dir
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.train.job import JobOutcome, TrainingJob
from albert_dist.train.loop import TaskSpec
from albert_dist.train.plan import Plan, base_plan

PROJECTION_FILE = "distill_projection.safetensors"


def teacher_layer(student_layer: int, student_layers: int, teacher_layers: int) -> int:
    """The teacher layer (1-based) whose output student layer `student_layer` (1-based) imitates."""
    return round(student_layer * teacher_layers / student_layers)


class DistillationModel(torch.nn.Module):
    """Student + frozen teacher (+ the hidden-state projection). Its parameters that train are the student's
    and the projection's; `train()` never takes the teacher out of eval mode."""

    def __init__(
        self, student: AlbertForSequenceClassification, teacher: AlbertForSequenceClassification, match_hidden: bool
    ):
        super().__init__()
        self.student, self.teacher = student, teacher.eval().requires_grad_(False)
        hs, ht = student.config.hidden_size, teacher.config.hidden_size
        self.match_hidden = match_hidden
        self.projection = torch.nn.Linear(hs, ht) if match_hidden and hs != ht else None

    def train(self, mode: bool = True):
        super().train(mode)
        self.teacher.eval()
        return self

    @property
    def gradient_checkpointing(self) -> bool:
        """`train.activation_checkpointing` recomputes the student's layers: the frozen teacher runs without
        gradients and keeps no activations to recompute."""
        return self.student.gradient_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, enabled: bool) -> None:
        self.student.gradient_checkpointing = enabled

    def forward(self, input_ids, attention_mask, token_type_ids):
        """(student logits, teacher logits, hidden-state MSE or None); a QA head's start and end logits stacked as
        [B, T, 2]."""
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            output_hidden_states=self.match_hidden,
        )
        with torch.no_grad():
            teacher = self.teacher(**inputs)
        student = self.student(**inputs)
        hidden = (
            self.hidden_mse(student.hidden_states, teacher.hidden_states, attention_mask) if self.match_hidden else None
        )
        return _logits(student), _logits(teacher), hidden

    def flops_per_token(self, seq_len: int) -> float:
        """The student's training step plus the teacher's forward pass."""
        return self.student.flops_per_token(seq_len) + self.teacher.flops_per_token(seq_len, training=False)

    def hidden_mse(self, student_states, teacher_states, attention_mask) -> torch.Tensor:
        s_inner, t_inner = self.student.config.inner_group_num, self.teacher.config.inner_group_num
        Ls, Lt = self.student.config.num_hidden_layers, self.teacher.config.num_hidden_layers
        mask = attention_mask.unsqueeze(-1).float()
        total = 0.0
        for i in range(1, Ls + 1):
            s = student_states[i * s_inner].float()
            t = teacher_states[teacher_layer(i, Ls, Lt) * t_inner].float()
            if self.projection is not None:
                s = self.projection(s)
            total = total + (((s - t) ** 2) * mask).sum() / (mask.sum() * t.shape[-1])
        return total / Ls


def _logits(out) -> torch.Tensor:
    if isinstance(out, AlbertQuestionAnsweringOutput):
        return torch.stack((out.start_logits, out.end_logits), -1)
    return out.logits


def distillation_loss(student_logits, teacher_logits, labels, temperature: float, alpha: float):
    """(α·T²·KL(student/T ‖ teacher/T) + (1−α)·CE, KL term, CE term), averaged over the labelled rows: sentences,
    or for token classification the tagged positions (labels -100 are left out of both terms, by weight rather
    than by selection, which would read their count back from the device)."""
    T, classes = temperature, student_logits.shape[-1]
    student = student_logits.float().reshape(-1, classes)
    teacher = teacher_logits.float().reshape(-1, classes)
    labels = labels.long().reshape(-1)
    kept = (labels != IGNORE_INDEX).float()
    divergence = F.kl_div(
        F.log_softmax(student / T, -1), F.log_softmax(teacher / T, -1), reduction="none", log_target=True
    )
    kd = (divergence.sum(-1) * kept).sum() / kept.sum().clamp(min=1) * T * T
    ce = F.cross_entropy(student, labels, ignore_index=IGNORE_INDEX)
    return alpha * kd + (1 - alpha) * ce, kd, ce


def span_distillation_loss(
    student_logits, teacher_logits, start_positions, end_positions, attention_mask, temperature: float, alpha: float
):
    """Question answering's (α·KD + (1−α)·CE, KD, CE): for the start and for the end, the KL divergence between
    the two models' distributions over a row's positions (padding left out) and the cross-entropy of the gold
    position, each averaged over the rows and then over start and end."""
    T = temperature
    padding = attention_mask.unsqueeze(-1) == 0
    # a large finite logit rather than -inf: masked positions then add 0·(a − a) to the divergence, not NaN
    student = student_logits.float().masked_fill(padding, -1e4)
    teacher = teacher_logits.float().masked_fill(padding, -1e4)
    divergence = F.kl_div(
        F.log_softmax(student / T, 1), F.log_softmax(teacher / T, 1), reduction="none", log_target=True
    )
    kd = divergence.sum(1).mean() * T * T  # summed over positions, averaged over rows and over start and end
    width = student.shape[1]
    ce = (
        sum(
            F.cross_entropy(student[..., i], positions.long().clamp(0, width), ignore_index=width)
            for i, positions in enumerate((start_positions, end_positions))
        )
        / 2
    )
    return alpha * kd + (1 - alpha) * ce, kd, ce


@dataclass(frozen=True)
class DistillationSpec(TaskSpec):
    """A distillation job's task: the student's fine-tuning (`classification`, from the student's initial
    weights) with the frozen teacher in `teacher_dir` and the loss's settings."""

    classification: ClassificationSpec
    teacher_dir: str
    temperature: float
    alpha: float
    hidden_weight: float

    def build(self, rank: int, world_size: int, dataset: Callable[[str], Any]) -> DistillationTask:
        if isinstance(self.classification, QuestionAnsweringSpec):
            return QuestionAnsweringDistillationTask(self, rank, world_size, dataset)
        tagged = isinstance(self.classification, TokenClassificationSpec)
        return (TokenDistillationTask if tagged else DistillationTask)(self, rank, world_size, dataset)


class DistillationTask(SequenceClassificationTask):
    def __init__(self, spec: DistillationSpec, rank: int, world_size: int, dataset: Callable[[str], Any]):
        super().__init__(spec.classification, rank, world_size, dataset)
        self.distill = spec

    def build_model(self) -> torch.nn.Module:
        head = job.model_class(self.spec.task)
        student = head.from_pretrained(self.spec.init_from)
        teacher = head.from_pretrained(self.distill.teacher_dir)
        return DistillationModel(student, teacher, self.distill.hidden_weight > 0)

    def num_hidden_groups(self, model) -> int:
        return model.student.config.num_hidden_groups

    def loss(self, model, batch):
        d = self.distill
        student_logits, teacher_logits, hidden = model(
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
        )
        loss, kd, ce = self.distillation_loss(student_logits, teacher_logits, batch)
        if hidden is not None:
            loss = loss + d.hidden_weight * hidden
        stats = self.student_statistics(student_logits, loss, batch)
        n = stats["count"]
        stats.update(kd_loss_sum=kd.detach() * n, ce_loss_sum=ce.detach() * n)
        if hidden is not None:
            stats["hidden_loss_sum"] = hidden.detach() * n
        return loss, stats

    def distillation_loss(self, student_logits, teacher_logits, batch):
        return distillation_loss(
            student_logits, teacher_logits, batch["label"], self.distill.temperature, self.distill.alpha
        )

    def student_statistics(self, logits, loss, batch):
        return self.statistics(logits, loss, batch)

    def summarize(self, sums):
        out = super().summarize(sums)
        count = max(1.0, sums.get("count", 0.0))
        out.update(
            {
                name[:-4]: sums[name] / count
                for name in ("kd_loss_sum", "ce_loss_sum", "hidden_loss_sum")
                if name in sums
            }
        )
        return out

    def save_model(self, model, directory: Path) -> None:
        super().save_model(model.student, directory)

    def save_training_only(self, model, directory: Path) -> None:
        if model.projection is not None:
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in model.projection.state_dict().items()},
                str(directory / PROJECTION_FILE),
            )

    def load_weights(self, model, directory: Path) -> None:
        model.student.load_state_dict(job.model_class(self.spec.task).from_pretrained(directory).state_dict())
        if model.projection is not None:
            model.projection.load_state_dict(load_file(str(directory / PROJECTION_FILE)))


class TokenDistillationTask(DistillationTask, TokenClassificationTask):
    """Per-token distillation of a NER teacher: the loss above over tagged positions, the statistics and entity
    metrics of token classification."""


class QuestionAnsweringDistillationTask(DistillationTask, QuestionAnsweringTask):
    """Per-position distillation of a QA teacher (`span_distillation_loss`), scored by the answers decoded from
    the student's start and end logits."""

    def distillation_loss(self, student_logits, teacher_logits, batch):
        d = self.distill
        return span_distillation_loss(
            student_logits,
            teacher_logits,
            batch["start_position"],
            batch["end_position"],
            batch["attention_mask"],
            d.temperature,
            d.alpha,
        )

    def student_statistics(self, logits, loss, batch):
        return self.statistics(logits[..., 0], logits[..., 1], loss, batch)


DEFAULT_STUDENT_LAYERS = 4


def build_student(
    teacher: AlbertForSequenceClassification, cfg: DistillJobConfig, teacher_dir: str | Path | None = None
) -> AlbertForSequenceClassification:
    """The student: `student.init_from` as it is (a fresh classifier on it), or the teacher's config with the
    student's overrides; with `init_from_teacher` (the default then) every teacher tensor whose name and shape
    fit is copied (all of them when the hidden size is kept)."""
    if cfg.student.init_from:
        return _pretrained_student(teacher, cfg.student.init_from, teacher_dir)
    overrides = {"num_hidden_layers": DEFAULT_STUDENT_LAYERS, **cfg.student.overrides()}
    layers = overrides["num_hidden_layers"]
    if teacher.config.num_hidden_groups > layers:
        raise ConfigError(
            f"student.num_hidden_layers ({layers}) is below the teacher's num_hidden_groups "
            f"({teacher.config.num_hidden_groups})"
        )
    try:
        config = AlbertConfig.from_dict(teacher.config.to_dict(), **overrides)
    except ConfigError as err:
        raise ConfigError(f"student: {err}") from None
    torch.manual_seed(cfg.run.seed)
    student = type(teacher)(config)
    if cfg.student.init_from_teacher is not False:
        own = student.state_dict()
        fitting = {k: v for k, v in teacher.state_dict().items() if k in own and own[k].shape == v.shape}
        student.load_state_dict(fitting, strict=False)
    return student


def _pretrained_student(
    teacher: AlbertForSequenceClassification, student_dir: str, teacher_dir: str | Path | None
) -> AlbertForSequenceClassification:
    """A separately pretrained ALBERT with the teacher's vocabulary (checked token by token when both
    directories hold a tokenizer), with the teacher's labels on a new classifier."""
    c = teacher.config
    student_config = load_config(student_dir)
    if student_config.vocab_size != c.vocab_size:
        raise ConfigError(
            f"student.init_from {student_dir} has a vocabulary of {student_config.vocab_size} "
            f"tokens, the teacher {c.vocab_size}: distillation needs the same vocabulary"
        )
    if teacher_dir is not None:
        tokens = [load_tokenizer(d).convert_ids_to_tokens(range(c.vocab_size)) for d in (teacher_dir, student_dir)]
        differing = next((i for i, (a, b) in enumerate(zip(*tokens)) if a != b), None)
        if differing is not None:
            raise ConfigError(
                f"student.init_from {student_dir} has another vocabulary than the teacher (token "
                f"{differing}: {tokens[1][differing]!r}, teacher {tokens[0][differing]!r})"
            )
    return type(teacher).from_pretrained(
        student_dir, num_labels=c.num_labels, id2label=c.id2label, label2id=c.label2id, problem_type=c.problem_type
    )


def weights_digest(model: torch.nn.Module) -> str:
    """What identifies the student's initial weights (its shape and values)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def compare(teacher, student, task_data: job.TaskData, cfg: DistillJobConfig) -> dict[str, float]:
    """Teacher and student dev metrics, the student's share of the teacher's metric, parameter counts and the
    inference speedup on the same batch, machine and precision."""
    metric = cfg.best_metric
    dev = task_data.splits["dev"]
    t_metrics, s_metrics = (evaluate_split(model, "dev", task_data, cfg) for model in (teacher, student))
    batch = next(batching.batches(dev, cfg.distill.speed_batch_size, cfg.data.pad_to_multiple_of))
    models = {"teacher": teacher, "student": student}
    speed = inference.throughputs(models, batch, cfg.train.precision, cfg.distill.speed_repeats)
    flops = {name: model.flops_per_token(batch["input_ids"].shape[1], training=False) for name, model in models.items()}
    out = {f"teacher_dev_{k}": v for k, v in t_metrics.items()}
    out.update({f"student_dev_{k}": v for k, v in s_metrics.items()})
    out.update(
        {
            "student_share_of_teacher": s_metrics[metric] / t_metrics[metric] if t_metrics.get(metric) else 0.0,
            "teacher_parameters": float(parameter_count(teacher)),
            "student_parameters": float(parameter_count(student)),
            "teacher_sequences_per_s": speed["teacher"],
            "student_sequences_per_s": speed["student"],
            "speedup": speed["student"] / speed["teacher"],
            "student_flops_share": flops["student"] / flops["teacher"],  # the speedup the compute alone would give
        }
    )
    return out


def evaluate_split(model, split: str, task_data: job.TaskData, cfg: DistillJobConfig):
    """The dev or test metrics of a teacher or student, as fine-tuning computes them for its task."""
    encoded = task_data.splits[split]
    settings = {
        "batch_size": cfg.finetune.eval_batch_size,
        "pad_to_multiple_of": cfg.data.pad_to_multiple_of,
        "precision": cfg.train.precision,
    }
    if isinstance(model, AlbertForQuestionAnswering):
        return qa_task.evaluate_questions(model, encoded, task_data.gold[split], task_data.decoding, **settings)
    if isinstance(model, AlbertForTokenClassification):
        names = task_data.label_names
        return token_task.evaluate_tokens(model, encoded, names, entities.scheme_of(names), **settings)
    return inference.evaluate(model, encoded, task="classification", **settings)


def plan(cfg: DistillJobConfig) -> Plan:
    """Load the teacher, tokenize the task data with its labels, build the student: the run's plan."""
    # a metric the teacher's task lacks is refused before anything is read
    teacher_dir, task, metric = cfg.distill.teacher, cfg.task, cfg.best_metric
    teacher = job.model_class(task).from_pretrained(teacher_dir)
    names = [teacher.config.id2label[i] for i in range(teacher.config.num_labels)]
    task_data = job.prepare_task_data(cfg.data, task, teacher_dir, label_names=names)
    train, per_epoch = job.schedule(cfg.train, cfg.finetune, len(task_data.splits["train"]), cfg.scaling.num_workers)
    student = build_student(teacher, cfg, teacher_dir)
    student_init = cfg.run.run_dir / "student_init"
    d = cfg.distill
    student_task = job.classification_spec(
        init_from=str(student_init),
        task_data=task_data,
        task=task,
        finetune=cfg.finetune,
        train=train,
        data_section=cfg.data,
        per_epoch=per_epoch,
        seed=cfg.run.seed,
        model_overrides={},
        tokenizer_dir=str(teacher_dir),
        metric=metric,
    )
    spec = DistillationSpec(
        student_task,
        teacher_dir=str(teacher_dir),
        temperature=d.temperature,
        alpha=d.alpha,
        hidden_weight=d.hidden_weight,
    )

    def stage(run) -> None:
        publish_dir(
            student_init, lambda directory: save_with_tokenizer(student, teacher_dir, directory), marker=CONFIG_NAME
        )
        job.log_task_data(run, cfg.data, task_data)

    def evaluate(model_dir: Path) -> dict[str, float]:
        distilled = type(teacher).from_pretrained(model_dir)
        values = compare(teacher, distilled, task_data, cfg)
        if "test" in task_data.splits:
            test = evaluate_split(distilled, "test", task_data, cfg)
            values.update({f"test_{k}": v for k, v in test.items()})
        return values

    return base_plan(
        cfg,
        task=spec,
        train=train,
        data_digest=job.task_data_digest(cfg.data),
        stage=stage,
        evaluate=evaluate,
        datasets=lambda: job.task_datasets(task_data),
        tags=job.lineage_tags(teacher_dir),
        label_names=names,
        inputs={
            **job.encoded_digests(task_data),
            "student": weights_digest(student),
            "student_config": student.config.to_dict(),
        },
        params={
            "train.derived_max_steps": train.max_steps,
            "train.derived_warmup_steps": train.warmup_steps,
            "student.num_parameters": parameter_count(student),
            "teacher.num_parameters": parameter_count(teacher),
        },
        banner=[
            f"distilling {teacher_dir} ({parameter_count(teacher) / 1e6:.2f}M parameters, "
            f"{teacher.config.num_hidden_layers} layers, H={teacher.config.hidden_size}) into a student of "
            f"{parameter_count(student) / 1e6:.2f}M ({student.config.num_hidden_layers} layers, "
            f"H={student.config.hidden_size}); {train.max_steps} steps"
        ],
        driver={
            "speed_batch_size": d.speed_batch_size,
            "speed_repeats": d.speed_repeats,
            "eval_batch_size": cfg.finetune.eval_batch_size,
            "precision": cfg.train.precision,
        },
    )


def save_with_tokenizer(model, tokenizer_source: str | Path, directory: Path) -> None:
    model.save_pretrained(directory)
    load_tokenizer(tokenizer_source).save(directory)


def _summary(cfg: DistillJobConfig, outcome: JobOutcome) -> list[str]:
    m, metric = outcome.metrics, cfg.best_metric
    return [
        f"teacher dev {metric} {m[f'teacher_dev_{metric}']:.4f} | student dev {metric} "
        f"{m[f'student_dev_{metric}']:.4f} ({100 * m['student_share_of_teacher']:.1f}% of the teacher)",
        f"parameters: teacher {m['teacher_parameters'] / 1e6:.2f}M, student {m['student_parameters'] / 1e6:.2f}M; "
        f"inference ({cfg.train.precision}, batch {cfg.distill.speed_batch_size}): teacher "
        f"{m['teacher_sequences_per_s']:.0f}/s, student {m['student_sequences_per_s']:.0f}/s, "
        f"speedup ×{m['speedup']:.2f} (the student computes {100 * m['student_flops_share']:.0f}% of the "
        f"teacher's FLOPs)",
        f"student model: {outcome.model_dir}",
    ]


DISTILL = TrainingJob("distill", plan, job.classifier_model, _summary, "distilled")
