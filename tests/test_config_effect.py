"""Every key of every training job has an effect: set to another valid value, it changes the job's resolved plan
(`TrainingJob.plan(cfg).resolved()`: the workers' task, the loop's settings, the Ray configs, the data as read,
what the driver tracks and its own settings), resolved from real inputs (prepared data, models, task files)
without training.

Each leaf key of the job's config is set to a value other than its default: a boolean flipped, another choice of
a literal, an int plus one, a float halved (0.1 for 0), or the value `ALTERNATIVES` gives (with the other keys it
needs). The tracking keys change the plan's `tracking` (where its MLflow run is recorded); the few keys that cannot
change a plan are listed in `OUTPUT_ONLY`, each with why.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from effect_helpers import Together, keys_without_effect, leaf_keys
from finetune_helpers import pair_rows, tiny_model_dir, write_csv
from ner_helpers import passages
from pydantic import Field
from qa_helpers import questions, write_squad

from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.errors import ConfigError
from albert_dist.finetune import entities

# keys that only token classification or reading comprehension reads: each is checked on a plan of its own task
# (test_every_key_of_token_classification_and_reading_changes_its_plan), not on the sentence classifier's
OTHER_TASKS = {
    "data.tokens_column": "token classification",
    "data.tags_column": "token classification",
    "data.doc_stride": "token classification (and long texts as windows)",
    "data.max_question_length": "reading comprehension",
    "data.max_answer_length": "reading comprehension",
    "data.language": "reading comprehension",
}
OUTPUT_ONLY = {
    "pretrain": {},
    "finetune": {
        "data.format": "the files' own format: auto reads each by its extension, another "
        "format on the same file is an error, not another plan",
        **OTHER_TASKS,
    },
    "distill": {"data.format": "as fine-tuning's", **OTHER_TASKS},
}


REFUSED = {"distill": {"data.labels": "distillation learns the teacher's labels"}}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, stdlib_corpus):
    """A tokenizer, two tiny models on it (and each as a teacher of the labels no and yes), task files with two
    texts, two label columns and a numeric score."""
    from albert_dist.tokenizer.training import train_sentencepiece

    root = tmp_path_factory.mktemp("effect")
    corpus = root / "corpus.txt"
    corpus.write_text(stdlib_corpus.read_text()[:60_000])
    tokenizer = train_sentencepiece([corpus], root / "tokenizer", 300, progress=lambda _: None).parent
    tiny_model_dir(root / "model", tokenizer)
    tiny_model_dir(root / "other_model", tokenizer, hidden_size=32, num_attention_heads=2)
    for name in ("model", "other_model"):
        teacher(root / name, root / f"{name}_teacher")
    rows = [
        {
            "text": row["sentence1"],
            "sentence": row["sentence2"],
            "label": ["no", "yes"][row["label"]],
            "label2": ["no", "yes"][i % 2],
            "score": float(i % 5),
        }
        for i, row in enumerate(pair_rows(120, seed=1))
    ]
    write_csv(root / "train.csv", rows)
    write_csv(root / "other_train.csv", rows[::-1][:100])
    write_csv(root / "dev.csv", rows[:40])
    write_csv(root / "test.csv", rows[40:80])
    tagged = [  # sentences past the 32-piece length, so that the windows' overlap matters
        {"tokens": list(text), "words": list(text[::-1]), "tags": tags, "labels": tags[::-1]}
        for text, spans in passages(40, seed=2, most=3)
        for tags in [entities.tags_from_spans(len(text), spans)]
    ]
    (root / "tagged.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in tagged), encoding="utf-8"
    )
    write_squad(root / "reading.json", questions(40, seed=3))
    return root


@pytest.fixture(scope="module")
def prepared(inputs, ray_session):
    """The corpus prepared for pretraining with Ray Data (and a copy), a model on its tokenizer."""
    from albert_dist.data.prepare import prepare_dataset

    prepare_dataset(
        load_config(
            DataJobConfig,
            None,
            [
                f"run.output_dir={inputs}",
                f"data.inputs=[{inputs / 'corpus.txt'}]",
                "data.format=blocks",
                "data.output=prepared",
                "data.max_seq_length=64",
                "data.eval_fraction=0.1",
                f"tokenizer.path={inputs / 'tokenizer'}",
            ],
        )
    )
    shutil.copytree(inputs / "prepared", inputs / "prepared_copy")
    return inputs


def teacher(model_dir: Path, directory: Path) -> Path:
    """`model_dir` as a classifier of the labels no and yes (a teacher of distillation)."""
    from albert_dist.model import AlbertForSequenceClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    AlbertForSequenceClassification.from_pretrained(
        model_dir, num_labels=2, id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1}
    ).save_pretrained(directory)
    load_tokenizer(model_dir).save(directory)
    return directory


def common(root: Path) -> dict[str, Any]:
    return {
        "run.output_dir": str(root / "elsewhere"),
        "run.name": "other",
        "train.peak_tflops": 10.0,
        "tracking.tracking_uri": f"sqlite:///{root / 'other.db'}",
        "tracking.register_model": "albert-registered",
        "tracking.experiment": "another-experiment",
    }


def test_every_pretraining_key_changes_the_plan(prepared):
    from albert_dist.pretrain.config import PretrainJobConfig
    from albert_dist.pretrain.job import PRETRAIN

    cfg = load_config(
        PretrainJobConfig,
        None,
        [
            f"run.output_dir={prepared}",
            "data.output=prepared",
            "model.embedding_size=16",
            "model.hidden_size=32",
            "model.num_attention_heads=2",
            "model.intermediate_size=64",
            "train.max_steps=10",
            "train.warmup_steps=2",
        ],
    )
    shape = {f"model.{k}": None for k in ("embedding_size", "hidden_size", "num_attention_heads", "intermediate_size")}
    alternatives = {
        **common(prepared),
        "run.output_dir": Together(
            {"run.output_dir": str(prepared / "elsewhere"), "data.output": str(prepared / "prepared")}
        ),
        "model.preset": "base",
        "model.init_from": Together({"model.init_from": str(prepared / "model"), **shape}),
        "model.hidden_size": 48,
        "model.num_attention_heads": 4,  # the heads divide the width
        "model.num_hidden_layers": 2,
        "model.num_hidden_groups": 2,
        "model.inner_group_num": 2,
        "model.hidden_act": "relu",
        "model.max_position_embeddings": 256,
        "model.hidden_dropout_prob": 0.05,
        "model.attention_probs_dropout_prob": 0.05,
        "model.classifier_dropout_prob": 0.05,
        "data.output": "prepared_copy",
        "data.cache": "stream",
        "train.phases": [{"steps": 5}, {"steps": 5, "batch_size": 4, "max_seq_length": 64, "data": "prepared_copy"}],
        "scaling.resize_check_s": Together({"scaling.resize_check_s": 30.0, "scaling.num_workers": [1, 2]}),
    }
    assert keys_without_effect(PRETRAIN.plan, cfg, alternatives, OUTPUT_ONLY["pretrain"]) == []


def task_alternatives(root: Path) -> dict[str, Any]:
    by_steps = {"finetune.epochs": None, "train.max_steps": 7}
    return {
        **common(root),
        "data.train": str(root / "other_train.csv"),
        "data.dev": str(root / "dev.csv"),
        "data.test": str(root / "test.csv"),
        "data.text_column": "sentence",
        "data.text_pair_column": "sentence",
        "data.label_column": "label2",
        "data.labels": ["yes", "no"],
        "data.max_seq_length": 48,
        "data.drop_labels": ["yes"],
        "finetune.lr_scales": {"head": 2.0},
        "finetune.metric": "f1",
        "finetune.early_stopping_patience": 2,
        "finetune.epochs": Together(by_steps),
        "train.max_steps": Together(by_steps),
    }


def task_config(cls, root: Path, **sections) -> Any:
    return cls.model_validate(
        {
            "run": {"output_dir": str(root)},
            "data": {"train": str(root / "train.csv"), "max_seq_length": 32},
            "scaling": {"num_workers": 1},
            "train": {"batch_size": 8},
            **sections,
        }
    )


def test_every_finetuning_key_changes_the_plan(inputs):
    from albert_dist.finetune.config import FinetuneJobConfig
    from albert_dist.finetune.job import FINETUNE

    cfg = task_config(FinetuneJobConfig, inputs, model={"init_from": str(inputs / "model")})
    alternatives = {
        **task_alternatives(inputs),
        "model.init_from": str(inputs / "other_model"),
        "model.hidden_dropout_prob": 0.05,
        "model.attention_probs_dropout_prob": 0.05,
        "model.classifier_dropout_prob": 0.05,
        "finetune.task": Together({"finetune.task": "regression", "data.label_column": "score"}),
    }
    assert keys_without_effect(FINETUNE.plan, cfg, alternatives, OUTPUT_ONLY["finetune"]) == []


def test_every_key_of_token_classification_and_reading_changes_its_plan(inputs):
    """The keys only NER or reading comprehension reads, each on a plan of its own task."""
    from albert_dist.finetune.config import FinetuneJobConfig
    from albert_dist.finetune.job import FINETUNE

    model = {"init_from": str(inputs / "model")}
    tagging = task_config(
        FinetuneJobConfig,
        inputs,
        model=model,
        data={"train": str(inputs / "tagged.jsonl"), "max_seq_length": 32},
        finetune={"task": "token_classification"},
    )
    alternatives = {"data.tokens_column": "words", "data.tags_column": "labels", "data.doc_stride": 3}
    keys = {"data.tokens_column", "data.tags_column", "data.doc_stride"}
    assert keys_without_effect(FINETUNE.plan, tagging, alternatives, {}, only=keys) == []
    reading = task_config(
        FinetuneJobConfig,
        inputs,
        model=model,
        data={"train": str(inputs / "reading.json"), "max_seq_length": 64},
        finetune={"task": "question_answering"},
    )
    alternatives = {"data.max_question_length": 2, "data.max_answer_length": 5, "data.language": "en"}
    assert keys_without_effect(FINETUNE.plan, reading, alternatives, {}, only=set(alternatives)) == []


def test_every_distillation_key_changes_the_plan(inputs):
    from albert_dist.finetune.config import DistillJobConfig
    from albert_dist.finetune.distill import DISTILL

    cfg = task_config(DistillJobConfig, inputs, distill={"teacher": str(inputs / "model_teacher")})
    alternatives = {
        **task_alternatives(inputs),
        "distill.teacher": str(inputs / "other_model_teacher"),
        "student.init_from": str(inputs / "other_model"),
        "student.num_hidden_layers": 2,
        "student.hidden_size": 32,
        "student.num_attention_heads": 2,
        "student.intermediate_size": 64,
        "student.init_from_teacher": False,
    }
    assert keys_without_effect(DISTILL.plan, cfg, alternatives, {**OUTPUT_ONLY["distill"], **REFUSED["distill"]}) == []
    with pytest.raises(ConfigError, match="data: labels: distillation learns the teacher's labels"):
        load_config(DistillJobConfig, None, [f"distill.teacher={inputs / 'model'}", "data.labels=[neg, pos]"])


def test_a_key_the_plan_ignores_is_reported(inputs):
    """The check can fail: a key that nothing reads leaves the plan as it is."""
    from albert_dist.finetune.config import FinetuneJobConfig, FinetuneSection
    from albert_dist.finetune.job import FINETUNE

    class Ignored(FinetuneSection):
        never_read: int = 1

    class Job(FinetuneJobConfig):
        finetune: Ignored = Field(default_factory=Ignored)

    cfg = task_config(Job, inputs, model={"init_from": str(inputs / "model")})
    everything_else = {key: None for key, _ in leaf_keys(Job) if key != "finetune.never_read"}
    assert keys_without_effect(FINETUNE.plan, cfg, {}, everything_else) == [
        "finetune.never_read: {'finetune.never_read': 2} leaves the plan as it is"
    ]
