"""Ours' fine-tuning loop against transformers' Trainer in one process, without Ray: whether anything but the batch
order and the warmup's first step separates them, and how far the order alone moves dev F1.

    python benchmarks/check_finetune_vs_trainer.py qa /tmp/albert-bench-qa/train800-dev300-long0x60-seed1
    python benchmarks/check_finetune_vs_trainer.py ner /tmp/albert-bench-ner/train2000-dev600-corpusall-seed0 \
        --sides hf,ours+hf-order+hf-warmup --classifier-dropout 0

WORK is a work directory bench_qa (init-qa, short-train.json, short-dev.json) or bench_ner (init-model, train.conll,
dev.conll) wrote; both sides start from its initial model with bench_qa's / bench_ner's settings (AdamW 1e-3, decay
0.01, eps 1e-6, clip 1.0, 10 % warmup, batch 32, 128 pieces, length grouping, 2 epochs, fp32, 1 thread). Sides:

- `hf`: transformers' Trainer as bench_qa's / bench_ner's hf_side drives it; the rows of every batch it trains are
  recorded (WORK/hf_order<seed>.json).
- `ours`: train.loop.Trainer on the job's own task (finetune.job's data, schedule and spec), as a worker runs it.
- `ours+hf-order`: the same, fed the rows in the order the `hf` side of that seed trained them.
- `ours+hf-warmup`: the same, with transformers' linear schedule (lr 0 at the first step, step/warmup after;
  ours' warmup is one step ahead: (step + 1)/warmup).
- `ours+hf-order+hf-warmup`: both. Where nothing else differs it gives the `hf` side's answers and weights (NER:
  with --classifier-dropout 0, as each side draws its dropout masks from its own random stream).

Every side's model is scored by one meter, ours' decoding (qa_task.evaluate_questions / token_task.evaluate_tokens)
on ours' encoding of dev (equal to run_qa's / run_ner's there: same pieces, labels and answer positions). The seed is
the Trainer's and ours' run.seed: the order (and the dropout masks) change with it, the initial model does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path
from unittest import mock

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_finetune_hf import trainer_arguments, transformers_tokenizer  # noqa: E402

TASKS = {
    "qa": {"model": "init-qa", "train": "short-train.json", "dev": "short-dev.json", "task": "question_answering"},
    "ner": {"model": "init-model", "train": "train.conll", "dev": "dev.conll", "task": "token_classification"},
}
SETTINGS = {"batch_size": 32, "epochs": 2, "learning_rate": 1e-3, "weight_decay": 0.01, "warmup_ratio": 0.1}


class Rows:
    """An encoded split as the workers read one from Ray Data (`iter_batches` of numpy columns)."""

    def __init__(self, arrays):
        self.arrays = arrays

    def iter_batches(self, batch_size, batch_format):
        for start in range(0, len(self.arrays["length"]), batch_size):
            yield {k: v[start : start + batch_size] for k, v in self.arrays.items()}


def job_config(kind: str, work: Path, seed: int):
    from albert_dist.finetune.config import FinetuneJobConfig

    files = TASKS[kind]
    data = {"train": str(work / files["train"]), "dev": str(work / files["dev"]), "max_seq_length": 128}
    if kind == "qa":
        data.update(doc_stride=32, max_answer_length=30, language="zh")
    else:
        from bench_ner import LABELS

        data["labels"] = list(LABELS)
    return FinetuneJobConfig.model_validate(
        {
            "model": {"init_from": str(work / files["model"])},
            "data": data,
            "finetune": {"task": files["task"], "epochs": SETTINGS["epochs"], "warmup_ratio": SETTINGS["warmup_ratio"]},
            "train": {
                "optimizer": "adamw",
                "precision": "fp32",
                "learning_rate": SETTINGS["learning_rate"],
                "weight_decay": SETTINGS["weight_decay"],
                "batch_size": SETTINGS["batch_size"],
                "eval_every": 1_000_000,
            },
            "run": {"seed": seed, "name": "check", "output_dir": str(work / "check-out")},
        }
    )


def transformers_linear(warmup_steps: int, total_steps: int, power: float = 1.0, end_factor: float = 0.0):
    """transformers' get_linear_schedule_with_warmup, in `optim.warmup_poly_decay`'s place."""
    from transformers.optimization import _get_linear_schedule_with_warmup_lr_lambda

    return lambda step: _get_linear_schedule_with_warmup_lr_lambda(
        step, num_warmup_steps=warmup_steps, num_training_steps=total_steps
    )


def train_ours(kind: str, work: Path, seed: int, task_data, hf_order: bool, hf_warmup: bool, dropout: dict):
    from albert_dist.finetune import job
    from albert_dist.train import optim
    from albert_dist.train.loop import Trainer, WorkerEnv

    cfg = job_config(kind, work, seed)
    train, per_epoch = job.schedule(cfg.train, cfg.finetune, len(task_data.splits["train"]), 1)
    spec = job.classification_spec(
        init_from=cfg.model.init_from,
        task_data=task_data,
        task=cfg.task,
        finetune=cfg.finetune,
        train=train,
        data_section=cfg.data,
        per_epoch=per_epoch,
        seed=seed,
        model_overrides={**job.label_overrides(cfg.task, task_data.label_names), **dropout},
    )
    task = spec.build(0, 1, lambda name: Rows(task_data.splits[name].arrays))
    if hf_order:
        orders = json.loads((work / f"hf_order{seed}.json").read_text())
        size = SETTINGS["batch_size"]

        def in_hf_order(self, epoch, phase, start):
            return self._batches("train", size, np.asarray(orders[epoch])[start * size :], drop_last=True)

        task.train_batches_from = types.MethodType(in_hf_order, task)
    schedule = transformers_linear if hf_warmup else optim.warmup_poly_decay
    with mock.patch.object(optim, "warmup_poly_decay", schedule):
        trainer = Trainer(task, train, WorkerEnv(print_fn=lambda line: None), seed=seed)
        trainer.fit()
    return trainer.model.eval()


def train_hf(kind: str, work: Path, seed: int, dropout: dict):
    """transformers' Trainer as the benchmark's hf_side; the rows of each epoch in the order it trained them are
    written to WORK/hf_order<seed>.json."""
    from transformers import (
        AlbertForQuestionAnswering,
        AlbertForTokenClassification,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
        Trainer,
    )

    files = TASKS[kind]
    tokenizer = transformers_tokenizer(work / files["model"])
    if kind == "qa":
        from bench_qa import prepare_train_features, read_squad

        rows = prepare_train_features(tokenizer, read_squad(work / files["train"]), 128, 32)
        model_class, collator = AlbertForQuestionAnswering, DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    else:
        from bench_ner import encode_run_ner, read_conll

        rows = encode_run_ner(tokenizer, read_conll(work / files["train"]), 128)
        model_class = AlbertForTokenClassification
        collator = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=8)
    trained: list[int] = []

    def recording(features):
        trained.extend(f["index"] for f in features)
        return collator([{k: v for k, v in f.items() if k != "index"} for f in features])

    steps = SETTINGS["epochs"] * (len(rows) // SETTINGS["batch_size"])
    arguments = trainer_arguments(types.SimpleNamespace(**SETTINGS, seed=seed), work / "check-out", steps, True)
    arguments.remove_unused_columns = False  # the recording collator reads and drops `index`
    trainer = Trainer(
        model=model_class.from_pretrained(work / files["model"], **dropout),
        args=arguments,
        train_dataset=[{**row, "index": i} for i, row in enumerate(rows)],
        data_collator=recording,
    )
    trainer.train()
    per_epoch = len(trained) // SETTINGS["epochs"]
    epochs = [trained[e * per_epoch : (e + 1) * per_epoch] for e in range(SETTINGS["epochs"])]
    (work / f"hf_order{seed}.json").write_text(json.dumps(epochs))
    return trainer.model.eval()


def scores(kind: str, model, task_data, init_dir: Path) -> dict[str, float]:
    """One meter for every side: ours' decoding of ours' model class holding the side's weights."""
    from albert_dist.finetune import entities, job, qa_task, token_task

    ours = job.model_class(TASKS[kind]["task"]).from_pretrained(init_dir)
    ours.load_state_dict(model.state_dict())
    settings = {"batch_size": 64, "pad_to_multiple_of": 8, "precision": "fp32"}
    if kind == "qa":
        out = qa_task.evaluate_questions(
            ours, task_data.splits["dev"], task_data.gold["dev"], task_data.decoding, **settings
        )
        return {"f1": out["f1"], "exact_match": out["exact_match"]}
    names = task_data.label_names
    out = token_task.evaluate_tokens(ours, task_data.splits["dev"], names, entities.scheme_of(names), **settings)
    return {"f1": out["f1"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("work", type=Path)
    parser.add_argument("--sides", default="hf,ours,ours+hf-order,ours+hf-warmup,ours+hf-order+hf-warmup")
    parser.add_argument("--seeds", default=None, help="comma-separated; default: the work directory's seed")
    parser.add_argument(
        "--classifier-dropout",
        type=float,
        help="both sides' classifier_dropout_prob (NER's 0.1 by default): 0 takes the dropout masks, drawn from "
        "each side's own random stream, out of the comparison",
    )
    args = parser.parse_args()
    from albert_dist.finetune import job

    torch.set_num_threads(1)
    files = TASKS[args.task]
    init_dir = args.work / files["model"]
    dropout = {} if args.classifier_dropout is None else {"classifier_dropout_prob": args.classifier_dropout}
    seeds = [int(s) for s in (args.seeds or args.work.name.rsplit("seed", 1)[1]).split(",")]
    task_data = job.prepare_task_data(job_config(args.task, args.work, 0).data, files["task"], init_dir)
    for seed in seeds:
        for side in args.sides.split(","):
            started = time.perf_counter()
            if side == "hf":
                model = train_hf(args.task, args.work, seed, dropout)
            else:
                model = train_ours(
                    args.task, args.work, seed, task_data, "hf-order" in side, "hf-warmup" in side, dropout
                )
            checksum = float(sum(p.detach().double().abs().sum() for p in model.parameters()))
            row = {
                "side": side,
                "seed": seed,
                **scores(args.task, model, task_data, init_dir),
                "weights_abs_sum": checksum,
            }
            print(json.dumps({**row, "seconds": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
