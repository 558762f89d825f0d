"""The GPU path, made right on the CPU: every generator a rank draws from is in its checkpoint, `train.deterministic`
requests deterministic kernels, a training step of each of the product's tasks never makes the host wait for the
device, and the step, both optimizers, a restored checkpoint and packed batches never mix devices."""

import contextlib
import itertools
import shutil
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from albert_dist.config import TrainSection
from albert_dist.model import AlbertConfig, AlbertForPreTraining, AlbertForSequenceClassification
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
    env = WorkerEnv(device=cuda, report=lambda metrics, d: d and shutil.copytree(d, written) and None)
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

aten = torch.ops.aten
#: ops that make the host wait for the device: a value handed to the host (`.item()`, `bool()`, `float()` and `int()`
#: end in `_local_scalar_dense`), or an output whose size only the values tell (CUDA reads the size back first)
WAITING_OPS = {
    aten._local_scalar_dense,
    aten.nonzero,
    aten.bincount,
    aten.masked_select,
    aten._unique,
    aten._unique2,
    aten.unique_dim,
    aten.unique_consecutive,
    aten.unique_dim_consecutive,
}
INDEX_OPS = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


def waits(func, args, kwargs) -> bool:
    """Whether the op makes the host wait: one of WAITING_OPS, an index by a boolean mask (a `nonzero` under the
    hood), or `repeat_interleave` by a tensor of repeats without its `output_size`."""
    packet = func.overloadpacket
    if packet in WAITING_OPS:
        return True
    if packet in INDEX_OPS:
        indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
    if packet is aten.repeat_interleave:
        return func is not aten.repeat_interleave.self_int and kwargs.get("output_size") is None
    return False


class HostWaits(TorchDispatchMode):
    """Records every op that `waits`: on a GPU each one waits for every kernel queued before it."""

    def __init__(self):
        super().__init__()
        self.where: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if waits(func, args, kwargs):
            self.where.append(f"{func}: {_caller()}")
        return func(*args, **kwargs)


def _caller() -> str:
    frames = [
        f
        for f in traceback.extract_stack()
        if ("albert_dist" in f.filename or "torch" in f.filename) and "/torch/_" not in f.filename
    ]
    return " < ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in reversed(frames[-4:]))


@contextlib.contextmanager
def host_waits(monkeypatch):
    """The block's ops that make the host wait (`HostWaits`), and its `.tolist()`, `.numpy()` and `.cpu()` calls:
    on CPU tensors those dispatch no op, so they are counted where they are called."""
    where: list[str] = []
    with monkeypatch.context() as patch:
        for name in ("tolist", "numpy", "cpu"):
            original = getattr(torch.Tensor, name)

            def counted(self, *args, _original=original, _name=name, **kwargs):
                where.append(f"{_name}: {_caller()}")
                return _original(self, *args, **kwargs)

            patch.setattr(torch.Tensor, name, counted)
        with HostWaits() as mode:
            yield where
        where.extend(mode.where)


def test_the_watch_sees_every_way_to_wait(monkeypatch):
    x, mask, repeats = torch.arange(6.0), torch.arange(6) % 2 == 0, torch.tensor([1, 2])
    waiting = {
        "item": lambda: x.sum().item(),
        "bool": lambda: bool(x.sum() > 0),
        "nonzero": lambda: torch.nonzero(mask),
        "bincount": lambda: torch.bincount(repeats),
        "masked_select": lambda: x.masked_select(mask),
        "unique": lambda: torch.unique(repeats),
        "unique_consecutive": lambda: torch.unique_consecutive(repeats),
        "index by a mask": lambda: x[mask],
        "index_put by a mask": lambda: x.clone().index_put_((mask,), torch.tensor(0.0)),
        "repeat_interleave": lambda: torch.repeat_interleave(repeats),
        "cpu": lambda: x.cpu(),
        "tolist": lambda: x.tolist(),
    }
    for name, op in waiting.items():
        with host_waits(monkeypatch) as where:
            op()
        assert where, name
    with host_waits(monkeypatch) as where:
        x[torch.tensor([0, 2])], x.repeat_interleave(repeats.repeat(3), output_size=9), torch.argsort(x, stable=True)
    assert where == []


# the product's tasks on in-memory data; TINY's 60 ids: [PAD] [UNK] [CLS] [SEP] [MASK], then words
PAD, CLS, SEP, MASK = 0, 2, 3, 4
SEQ = 32


class InMemory:
    """A dataset as the tasks read one (Ray Data's `iter_batches` of numpy columns), from columns in memory."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.columns = columns

    def iter_batches(self, *, batch_size: int, batch_format: str = "numpy", drop_last: bool = False, **_):
        rows = len(next(iter(self.columns.values())))
        for start in range(0, rows - rows % batch_size if drop_last else rows, batch_size):
            yield {k: v[start : start + batch_size] for k, v in self.columns.items()}


def ragged(arrays: list[np.ndarray]) -> np.ndarray:
    out = np.empty(len(arrays), object)
    for i, array in enumerate(arrays):
        out[i] = array
    return out


def instances(count: int, seed: int) -> InMemory:
    """[CLS] A [SEP] B [SEP] pretraining instances, as prepared data holds them."""
    rng = np.random.default_rng(seed)
    ids, types, starts = [], [], []
    for a, b in rng.integers(1, 14, (count, 2)):
        ids.append(np.concatenate([[CLS], rng.integers(5, 60, a), [SEP], rng.integers(5, 60, b), [SEP]]))
        types.append((np.arange(len(ids[-1])) > a + 1).astype(np.int64))
        starts.append(rng.random(len(ids[-1])) < 0.7)
    return InMemory(
        {
            "input_ids": ragged(ids),
            "token_type_ids": ragged(types),
            "word_start": ragged(starts),
            "sop_label": rng.integers(0, 2, count),
        }
    )


def labelled(count: int, seed: int) -> InMemory:
    """Fine-tuning rows as encoded task data holds them: label = whether the first word is above the middle."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(6, SEQ + 1, count)
    ids = rng.integers(5, 60, (count, SEQ)) * (np.arange(SEQ) < lengths[:, None])
    ids[:, 0] = CLS
    return InMemory(
        {
            "input_ids": ids,
            "token_type_ids": np.zeros_like(ids),
            "length": lengths,
            "label": (ids[:, 1] > 32).astype(np.int64),
            "row": np.arange(count),
        }
    )


def prepared_train_split(directory: Path, rows: InMemory) -> dict:
    """`rows` written as a prepared dataset's training split (one Parquet shard), which pretraining reads by row
    number; returns the manifest's `splits`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = rows.columns
    count = len(columns["sop_label"])
    (directory / "train").mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "instance_id": np.arange(count),
            "input_ids": pa.array([list(map(int, r)) for r in columns["input_ids"]], pa.list_(pa.int32())),
            "token_type_ids": pa.array([list(map(int, r)) for r in columns["token_type_ids"]], pa.list_(pa.int8())),
            "word_start": pa.array([list(map(bool, r)) for r in columns["word_start"]], pa.list_(pa.bool_())),
            "sop_label": pa.array(columns["sop_label"], pa.int8()),
        }
    )
    pq.write_table(table, directory / "train" / "part-0.parquet")
    return {"train": {"rows": count, "shards": [{"path": "train/part-0.parquet", "rows": count}]}}


def pretraining_task(tmp_path: Path, packing: bool):
    import json

    from albert_dist.data.config import MaskingSection
    from albert_dist.pretrain.task import PretrainingSpec

    manifest = {
        "splits": prepared_train_split(tmp_path, instances(32, 0)),
        "tokenizer": {
            "vocab_size": TINY["vocab_size"],
            "pad_id": PAD,
            "mask_id": MASK,
            "special_ids": [CLS, SEP, MASK],
        },
        "config": {"masking": MaskingSection().model_dump()},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    spec = PretrainingSpec(
        prepared_dir=str(tmp_path),
        manifest=manifest,
        model_config=AlbertConfig(**TINY).to_dict(),
        masking=MaskingSection(mlm_probability=0.3, max_predictions_per_seq=6),
        batch_size=8,
        max_seq_length=SEQ,
        seed=0,
        eval_batches=1,
        has_eval=True,
        packing=packing,
    )
    return spec.build(0, 1, {"eval": instances(8, 1)}.__getitem__)  # training reads the shard


def saved_model(directory: Path, cls=AlbertForPreTraining, **config) -> Path:
    torch.manual_seed(0)
    cls(AlbertConfig(**{**TINY, **config})).save_pretrained(directory)
    return directory


def classification_spec(tmp_path: Path, init_from: Path):
    from albert_dist.finetune.task import ClassificationSpec

    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    words = [f"w{i}" for i in range(5, TINY["vocab_size"])]
    (tokenizer / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    return ClassificationSpec(
        init_from=str(init_from),
        tokenizer_dir=str(tokenizer),
        task="classification",
        num_labels=2,
        model_overrides={},
        metric="accuracy",
        patience=None,
        layer_lr_decay=0.9,
        lr_scales={},
        batch_size=8,
        eval_batch_size=8,
        grad_accum_steps=2,
        micro_batches_per_epoch=4,
        eval_rows=16,
        seed=0,
        pad_to_multiple_of=8,
        group_by_length=False,
        max_seq_length=SEQ,
    )


def finetuning_task(tmp_path: Path):
    spec = classification_spec(tmp_path, saved_model(tmp_path / "pretrained"))
    return spec.build(0, 1, {"train": labelled(32, 0), "dev": labelled(16, 1)}.__getitem__)


def distillation_task(tmp_path: Path):
    from albert_dist.finetune.distill import DistillationSpec

    teacher = saved_model(tmp_path / "teacher", AlbertForSequenceClassification, num_labels=2)
    student = saved_model(tmp_path / "student", num_hidden_layers=1, hidden_size=16, intermediate_size=32)
    spec = DistillationSpec(
        classification_spec(tmp_path, student), str(teacher), temperature=2.0, alpha=0.5, hidden_weight=1.0
    )
    return spec.build(0, 1, {"train": labelled(32, 0), "dev": labelled(16, 1)}.__getitem__)


TAGS = ("O", "B-X", "I-X")


def tagged_sentences(count: int, seed: int):
    """Sentences of the tiny vocabulary's words, a word tagged B-X where it is above the middle (I-X after one)."""
    from albert_dist.finetune.token_data import TaggedSplit

    rng = np.random.default_rng(seed)
    words = [[f"w{i}" for i in rng.integers(5, 60, rng.integers(3, SEQ - 2))] for _ in range(count)]
    tags = [
        [("I-X" if i and int(s[i - 1][1:]) > 32 else "B-X") if int(w[1:]) > 32 else "O" for i, w in enumerate(s)]
        for s in words
    ]
    return TaggedSplit("memory", words, tags, list(range(count)))


def spec_as(cls, base, **changes):
    """`base`'s fields as a spec of the subclass `cls`, with `changes`."""
    import dataclasses

    return cls(**{**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}, **changes})


def token_classification_task(tmp_path: Path):
    """NER rows encoded as the job encodes them (`token_data.encode_tagged`: windows, first-piece labels, word
    indexes for scoring)."""
    from albert_dist.finetune import token_data
    from albert_dist.finetune.token_task import TokenClassificationSpec
    from albert_dist.model import AlbertForTokenClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    base = classification_spec(tmp_path, saved_model(tmp_path / "init", AlbertForTokenClassification, num_labels=3))
    tokenizer = load_tokenizer(base.tokenizer_dir)
    label2id = {name: i for i, name in enumerate(TAGS)}
    train, dev = tagged_sentences(32, 0), tagged_sentences(16, 1)
    splits = {
        name: InMemory(token_data.encode_tagged(split, tokenizer, SEQ, 8, token_data.tag_ids(split, label2id)).arrays)
        for name, split in (("train", train), ("dev", dev))
    }
    eval_words = sum(len(sentence) for sentence in dev.words)
    spec = spec_as(
        TokenClassificationSpec, base, task="token_classification", num_labels=3, metric="f1", label_names=TAGS,
        eval_rows=eval_words,
    )  # fmt: skip
    return spec.build(0, 1, splits.__getitem__)


def questions(count: int, seed: int):
    """Questions whose answer is the context's word above the middle that the question names by its neighbour."""
    from albert_dist.finetune.qa_data import QuestionSplit

    rng = np.random.default_rng(seed)
    ids, asked, contexts, answers = [], [], [], []
    for q in range(count):
        words = [f"w{i}" for i in rng.integers(5, 33, rng.integers(4, 20))]
        at = int(rng.integers(1, len(words)))
        words[at] = f"w{rng.integers(33, 60)}"
        context = " ".join(words)
        start = len(" ".join(words[:at])) + 1
        ids.append(str(q)), asked.append(words[at - 1]), contexts.append(context)
        answers.append([(words[at], start)])
    return QuestionSplit("memory", ids, asked, contexts, answers)


def question_answering_task(tmp_path: Path):
    """Reading-comprehension windows encoded as the job encodes them (`qa_data.encode_questions`)."""
    from albert_dist.finetune import qa_data
    from albert_dist.finetune.qa_task import QuestionAnsweringSpec
    from albert_dist.model import AlbertForQuestionAnswering
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    base = classification_spec(tmp_path, saved_model(tmp_path / "init", AlbertForQuestionAnswering, num_labels=2))
    tokenizer = load_tokenizer(base.tokenizer_dir)
    train, dev = questions(32, 0), questions(16, 1)
    splits = {
        name: InMemory(qa_data.encode_questions(split, tokenizer, SEQ, 8, 8).arrays)
        for name, split in (("train", train), ("dev", dev))
    }
    spec = spec_as(
        QuestionAnsweringSpec, base, task="question_answering", num_labels=2, metric="f1", gold=dev.gold(),
        language="en", eval_rows=len(splits["dev"].columns["row"]),
    )  # fmt: skip
    return spec.build(0, 1, splits.__getitem__)


PRODUCT_TASKS = {
    "pretraining": lambda tmp_path: pretraining_task(tmp_path, packing=False),
    "pretraining packed": lambda tmp_path: pretraining_task(tmp_path, packing=True),
    "fine-tuning": finetuning_task,
    "distillation": distillation_task,
    "token classification": token_classification_task,
    "question answering": question_answering_task,
}


@pytest.mark.parametrize(
    "task_name, precision, optimizer",
    [
        ("pretraining", "bf16", "lamb"),
        ("pretraining packed", "fp16", "adamw"),
        ("fine-tuning", "fp32", "adamw"),
        ("fine-tuning", "fp16", "lamb"),
        ("distillation", "bf16", "adamw"),
        ("token classification", "bf16", "adamw"),
        ("question answering", "fp16", "adamw"),
    ],
)
def test_training_steps_never_wait_for_the_device(monkeypatch, tmp_path, task_name, precision, optimizer):
    """One training step of each of the product's tasks (what the loop runs for every micro-batch: the task's loss
    and statistics, the backward, their sums; then the clipping, the optimizer and the GradScaler) and one held-out
    batch's statistics never make the host wait for the device: no scalar read, no `.tolist()`/`.numpy()`/`.cpu()`,
    no op whose output size depends on values. Only the log interval's reduction reads back. Batches are collated
    first, outside the watch: that is host work on host tensors. (fp16 + GradScaler is for GPUs; the check that
    refuses it on CPU is lifted, as in test_loop, to run the same path.)"""
    monkeypatch.setattr(loop.precision, "resolve_precision", lambda requested, device: requested)
    train = settings(precision=precision, optimizer=optimizer, max_grad_norm=1.0, grad_accum_steps=2)
    trainer = Trainer(PRODUCT_TASKS[task_name](tmp_path), train, WorkerEnv())
    batches = list(itertools.islice(trainer._micro_batches(), train.grad_accum_steps * trainer.task.slots_held))
    held_out = next(iter(trainer.task.eval_batches()))
    window, evaluation = {}, {}
    with host_waits(monkeypatch) as where:
        trainer._train_step(iter(batches), window)
        trainer.model.eval()
        with torch.no_grad(), loop.precision.autocast(precision, trainer.env.device):
            loop._accumulate(evaluation, trainer.task.loss(trainer.model, held_out)[1])
    assert where == [], where[:5]
    metrics = trainer.task.summarize(loop.all_reduce_sums(window, trainer.env.device))
    held_out_metrics = trainer.task.summarize(loop.all_reduce_sums(evaluation, trainer.env.device))
    assert np.isfinite(metrics["loss"]) and np.isfinite(held_out_metrics["loss"])


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
        WorkerEnv(report=lambda metrics, d: d and shutil.copytree(d, written) and None),  # stored before returning
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
