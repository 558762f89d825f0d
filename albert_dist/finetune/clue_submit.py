"""`albert-dist predict --clue TASK`: a CLUE test file predicted into the file CLUE's leaderboard scores.

The layouts, as CLUE's submission guide ("中文任务基准测评 CLUE benchmark 任务提交说明", 2021-09-04) and the baselines
of CLUEbenchmark/CLUE and CLUEbenchmark/CLUENER2020 write them:

- classification (AFQMC, TNEWS, IFLYTEK, OCNLI, CMNLI, CSL, CLUEWSC2020): JSON lines `{"id": 0, "label": "1"}` in
  the order of test.json, whose `id` each line carries; only `label` is scored, against the value the task's own
  `label` field holds: TNEWS's and IFLYTEK's codes ("102", "110"; their names go beside it as `label_desc` /
  `label_des`, as in their data), OCNLI's and CMNLI's relation names, WSC's "true" / "false", "0" / "1" elsewhere.
  Files `<task>_predict.json`; CLUE 1.1's test sets of TNEWS and WSC as `tnews11_predict.json` and
  `cluewsc11_predict.json`, OCNLI trained on train.50k as `ocnli_50k_predict.json` (the names of CLUE's PaddleNLP
  baseline, baselines/paddlenlp/classification/run_clue_classifier.py).
- CLUENER2020: JSON lines `{"id": 0, "label": {type: {mention: [[start, end]]}}}`, the end included, as its training
  data (and CLUENER2020's bilstm_crf_pytorch/run_lstm_crf.py) writes entities: `cluener_predict.json`.
- CMRC2018: one JSON object `{question id: answer text}` (the guide's reading-comprehension layout; CLUE's
  baselines/paddlenlp/mrc/run_cmrc2018.py): `cmrc2018_predict.json`.

Every test file is read whole in this process (CLUE's largest, CMNLI's, is 13,880 pairs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from albert_dist.console import ProgressLine
from albert_dist.errors import ConfigError, DataError
from albert_dist.finetune import data, predict, qa_data, wsc
from albert_dist.model.checkpoint import load_config
from albert_dist.storage import is_uri, publish_file, read_bytes
from albert_dist.train.precision import resolve_precision

#: the columns that carry a CLUE row's id, first found wins (CLUEWSC2020's rows number themselves `idx`)
ID_COLUMNS = ("id", "idx")


@dataclass(frozen=True)
class ClueTask:
    """One CLUE task's submission: its file, the columns of its test rows (JSON lines) and which head predicts them."""

    file: str
    text: str = "sentence"
    pair: str | None = None
    head: str = predict.SEQUENCE_HEAD
    #: the field of TNEWS's and IFLYTEK's labels.json (and data) naming a label code; None: the labels are scored
    #: as the model names them
    name_field: str | None = None


TASKS = {
    "afqmc": ClueTask("afqmc_predict.json", "sentence1", "sentence2"),
    "tnews": ClueTask("tnews11_predict.json", name_field="label_desc"),
    "iflytek": ClueTask("iflytek_predict.json", name_field="label_des"),
    "ocnli": ClueTask("ocnli_50k_predict.json", "sentence1", "sentence2"),
    "cmnli": ClueTask("cmnli_predict.json", "sentence1", "sentence2"),
    "csl": ClueTask("csl_predict.json", "keyword", "abst"),
    "wsc": ClueTask("cluewsc11_predict.json", "text"),
    "cluener": ClueTask("cluener_predict.json", "text", head=predict.TOKEN_HEAD),
    "cmrc2018": ClueTask("cmrc2018_predict.json", head=predict.QUESTION_HEAD),  # SQuAD's layout: qa_data reads it
}
HEAD_NAMES = {
    predict.SEQUENCE_HEAD: "a sentence classifier",
    predict.TOKEN_HEAD: "a token classifier (finetune.task: token_classification)",
    predict.QUESTION_HEAD: "a reader (finetune.task: question_answering)",
}


@dataclass
class ClueRows:
    """A test file's ids in its order, and the texts (and pair texts) the model reads."""

    ids: list[Any]
    texts: list[str]
    pairs: list[str] | None


def write_submission(
    model_dir: str | Path,
    task: str,
    input_path: str | Path,
    output_dir: str | Path,
    *,
    labels_path: str | Path | None = None,
    batch_size: int = 64,
    precision: str = "auto",
    device: str = "auto",
    backend: str = "torch",
) -> str:
    """Predict CLUE `task`'s test file `input_path` with `model_dir` into `output_dir`/<the task's file>, published
    whole; returns that file's location. `labels_path` is TNEWS's or IFLYTEK's labels.json, for a model trained on
    their label names (`label_desc` / `label_des`)."""
    spec = task_spec(task)
    config = load_config(model_dir)
    head = predict.head_of(config)
    if head != spec.head or (head == predict.SEQUENCE_HEAD and predict.is_regression(config)):
        raise ConfigError(f"--clue {task} takes {HEAD_NAMES[spec.head]}; {model_dir} is not one")
    codes = label_codes(task, spec, config, labels_path)
    target = submission_path(output_dir, spec.file)
    rows = read_test(task, spec, str(input_path))
    device = "cpu" if backend == "onnx" and device == "auto" else device
    on_device = predict.local_device(device)
    resolve_precision(precision, torch.device(on_device))
    progress = ProgressLine("predict", total=len(rows.ids))
    predictor = predict.Predictor(
        model_dir,
        "text",
        "pair" if rows.pairs is not None else None,
        batch_size,
        precision=precision,
        on_batch=progress.update,
        device=on_device,
        backend=backend,
    )
    columns = {"text": np.asarray(rows.texts, dtype=object)}
    if rows.pairs is not None:
        columns["pair"] = np.asarray(rows.pairs, dtype=object)
    predicted = predictor(columns)
    progress.finish()
    if head == predict.TOKEN_HEAD:
        lines = [json.dumps(e, ensure_ascii=False) for e in cluener_lines(rows.ids, predicted[predict.ENTITIES])]
        content = "".join(line + "\n" for line in lines)
    elif head == predict.QUESTION_HEAD:
        answers = dict(zip(rows.ids, (str(a) for a in predicted["answer"])))
        content = json.dumps(answers, ensure_ascii=False, indent=2) + "\n"
    else:
        content = "".join(
            json.dumps(line, ensure_ascii=False) + "\n"
            for line in label_lines(rows.ids, predicted["predicted_label"], codes)
        )
    publish_file(target, lambda tmp: tmp.write_text(content, encoding="utf-8"), error=DataError)
    print(f"predicted {len(rows.ids)} rows of {input_path} with {model_dir} → {target} (CLUE {task})")
    return str(target)


def task_spec(task: str) -> ClueTask:
    if task not in TASKS:
        raise ConfigError(f"--clue {task}: CLUE tasks are {', '.join(TASKS)}")
    return TASKS[task]


def submission_path(output_dir: str | Path, name: str) -> str | Path:
    """`name` inside `output_dir` (a directory made if missing, or a URI prefix)."""
    if is_uri(output_dir):
        return f"{str(output_dir).rstrip('/')}/{name}"
    directory = Path(output_dir)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"--output {output_dir}: with --clue it is the directory {name} is written into")
    directory.mkdir(parents=True, exist_ok=True)
    return directory / name


def read_test(task: str, spec: ClueTask, path: str) -> ClueRows:
    """The test file's ids and texts: JSON lines of the task's columns (WSC's with its spans marked), or
    CMRC2018's SQuAD layout."""
    if spec.head == predict.QUESTION_HEAD:
        split = qa_data.read_questions(path)
        return ClueRows(question_ids(path), split.questions, split.contexts)
    table = data.read_table(path, "jsonl")
    ids = row_ids(table, path)
    if task == "wsc":
        return ClueRows(ids, wsc.marked_texts(table, path, spec.text), None)
    data.require_columns(table, f"{path} (CLUE {task})", text_column=spec.text, text_pair_column=spec.pair)
    pairs = data.text_values(table, spec.pair) if spec.pair else None
    return ClueRows(ids, data.text_values(table, spec.text), pairs)


def row_ids(table, path: str) -> list[Any]:
    """The id of each row, in file order, from the first of `ID_COLUMNS` the table has."""
    found = next((name for name in ID_COLUMNS if name in table.column_names), None)
    if found is None:
        raise DataError(
            f"{path}: no id column ({' or '.join(map(repr, ID_COLUMNS))}): CLUE matches each prediction to its test "
            f"row by id; the file has {', '.join(map(repr, table.column_names))}"
        )
    return checked_ids(table.column(found).to_pylist(), found, path, "row")


def checked_ids(ids: list[Any], field: str, path: str, unit: str) -> list[Any]:
    """`ids` when each is a whole number or a text and none repeats; else a DataError naming the first bad one."""
    seen: dict[Any, int] = {}
    for number, value in enumerate(ids, start=1):
        if value is None or isinstance(value, (dict, list, float, bool)) or value == "":
            raise DataError(f"{path}, {unit} {number}: {field!r} is {value!r}, not an id (a whole number or a text)")
        if value in seen:
            raise DataError(f"{path}, {unit} {number}: id {value!r} is also {unit} {seen[value]}'s")
        seen[value] = number
    return ids


def question_ids(path: str) -> list[Any]:
    """The `id` of each question, in file order, of a file `qa_data.read_questions` has read (the reader names a
    question without an id by its place, which CLUE could not match)."""
    raw = read_bytes(path).decode("utf-8-sig")
    try:
        document = json.loads(raw)
    except json.JSONDecodeError:  # several records: JSON lines
        document = None
    if isinstance(document, dict) and "data" in document:
        ids = [
            qa.get("id")
            for article in document["data"]
            for paragraph in article["paragraphs"]
            for qa in paragraph.get("qas") or []
        ]
        return checked_ids(ids, "id", path, "question")
    records = [json.loads(line) for line in raw.splitlines() if line.strip()]
    return checked_ids([record.get("id") for record in records], "id", path, "line")


def label_codes(task: str, spec: ClueTask, config, labels_path: str | Path | None) -> dict[str, dict[str, str]]:
    """What each of the model's labels is written as: {"label": ..., and for TNEWS and IFLYTEK their name field}.

    TNEWS and IFLYTEK are scored on their codes; a model trained on their names (`label_desc` / `label_des`, as
    clue_tnews.yaml and clue_iflytek.yaml train) needs the task's labels.json to write them."""
    if spec.name_field is None and labels_path:
        raise ConfigError(f"--clue-labels: CLUE {task} is scored on the model's labels as they are; leave it out")
    if spec.head != predict.SEQUENCE_HEAD:
        return {}
    names = [config.id2label[i] for i in range(config.num_labels)]
    if spec.name_field is None:
        return {name: {"label": name} for name in names}
    if labels_path is None:
        if all(name.isdigit() for name in names):
            return {name: {"label": name} for name in names}
        raise ConfigError(
            f"{task}: the model's labels are names ({', '.join(names[:3])}, ...) and CLUE scores {task}'s label "
            "codes: give the task's labels.json as --clue-labels"
        )
    table = data.read_table(labels_path, "jsonl")
    data.require_columns(table, labels_path, code_column="label", name_column=spec.name_field)
    pairs = zip(data.text_values(table, "label"), data.text_values(table, spec.name_field))
    by_name = {name: {"label": code, spec.name_field: name} for code, name in pairs}
    by_code = {entry["label"]: entry for entry in by_name.values()}
    known = by_code if all(name in by_code for name in names) else by_name
    unknown = [name for name in names if name not in known]
    if unknown:
        raise DataError(f"{labels_path}: the model's label {unknown[0]!r} is neither a code nor a name there")
    return {name: known[name] for name in names}


def label_lines(ids: list[Any], labels: np.ndarray, codes: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """The classification tasks' lines: each row's id and its predicted label as CLUE scores it (`label_codes`)."""
    return [{"id": row_id, **codes[str(label)]} for row_id, label in zip(ids, labels)]


def cluener_lines(ids: list[Any], entities: np.ndarray) -> list[dict[str, Any]]:
    """CLUENER's lines from predict's entities column (JSON of [{"type", "start", "end", "text"}], end excluded)."""
    lines = []
    for row_id, found in zip(ids, entities):
        label: dict[str, dict[str, list[list[int]]]] = {}
        for entity in json.loads(found):
            label.setdefault(entity["type"], {}).setdefault(entity["text"], []).append(
                [entity["start"], entity["end"] - 1]
            )
        lines.append({"id": row_id, "label": label})
    return lines
