"""Questions over contexts for extractive question answering: reading them, and encoding them as windows of
`[CLS] question [SEP] context-window [SEP]` with the answer's piece positions, as transformers' `run_qa` does.

Inputs: SQuAD v1/v2 JSON (`{"data": [{"paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text",
"answer_start"}], "is_impossible"}]}]}]}`), which CMRC2018 shares, and JSON lines of flat records as Hugging Face's
squad dataset holds them (`{"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}}`). An
answer that does not read as its text at its offset is a DataError naming file and question; a question without an
answer (SQuAD v2's `is_impossible`) points at [CLS].

The tokenizer has no offsets: each context is split into words with their character offsets
(`token_data.words_with_offsets`: each CJK character, each punctuation mark, each run of other characters) and
tokenized word by word, so every piece knows its word's characters; an answer is decoded back to the context's
characters from the first piece's word start to the last piece's word end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from albert_dist.data.batching import EncodedSplit, windows
from albert_dist.errors import ConfigError, DataError
from albert_dist.finetune.token_data import word_pieces, words_with_offsets
from albert_dist.storage import read_bytes
from albert_dist.text_encoding import first_undecodable, not_utf8_error
from albert_dist.tokenizer.backends import is_cjk

SPECIAL_PIECES = 3  # [CLS] question [SEP] context [SEP]


@dataclass
class QuestionSplit:
    """Questions of one split; `answers` holds each question's gold answers as (text, character start), none for
    a question the context does not answer."""

    source: str
    ids: list[str]
    questions: list[str]
    contexts: list[str]
    answers: list[list[tuple[str, int]]]

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, indices: np.ndarray, source: str) -> QuestionSplit:
        pick = lambda values: [values[i] for i in indices]  # noqa: E731
        return QuestionSplit(source, pick(self.ids), pick(self.questions), pick(self.contexts), pick(self.answers))

    @property
    def has_unanswerable(self) -> bool:
        return any(not answers for answers in self.answers)

    def gold(self) -> Gold:
        distinct = list(dict.fromkeys(self.contexts))
        index = {context: i for i, context in enumerate(distinct)}
        return Gold(
            tuple(distinct),
            tuple(index[c] for c in self.contexts),
            tuple(tuple(text for text, _ in answers) for answers in self.answers),
        )


@dataclass(frozen=True)
class Gold:
    """What scoring a split's answers needs, compactly (it travels to every worker): the distinct contexts, each
    question's context and its gold answer texts."""

    contexts: tuple[str, ...]
    context_of: tuple[int, ...]
    answers: tuple[tuple[str, ...], ...]


# ---------------------------------------------------------------------------------------------- reading


def read_questions(path: str) -> QuestionSplit:
    """A SQuAD-layout JSON file (SQuAD v1/v2, CMRC2018) or JSON lines of flat records."""
    raw = _text(path)
    stripped = raw.lstrip()
    document = None
    if stripped.startswith("{"):
        try:
            document = json.loads(stripped)
        except json.JSONDecodeError:  # several records: JSON lines
            document = None
    if isinstance(document, dict) and "data" in document:
        return _read_squad(path, document)
    return _read_records(path, raw)


def _text(path: str) -> str:
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from None
    undecodable = first_undecodable(raw)
    if undecodable:
        raise not_utf8_error(path, raw, undecodable)
    if not raw.strip():
        raise DataError(f"data file is empty: {path}")
    return raw.decode("utf-8-sig")


def _read_squad(path: str, document: dict) -> QuestionSplit:
    split = QuestionSplit(str(path), [], [], [], [])
    if not isinstance(document["data"], list):
        raise DataError(f"{path}: 'data' is not a list of articles (SQuAD's layout)")
    for a, article in enumerate(document["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise DataError(f"{path}: article {a + 1} has no 'paragraphs' list")
        for paragraph in paragraphs:
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            if not isinstance(context, str):
                raise DataError(f"{path}: a paragraph of article {a + 1} has no 'context' string")
            for qa in paragraph.get("qas") or []:
                qid = str(qa.get("id", f"article {a + 1}, question {len(split) + 1}"))
                answers = [] if qa.get("is_impossible") else qa.get("answers") or []
                if not all(isinstance(x, dict) for x in answers):
                    raise DataError(f"{path}: question {qid!r}: answers are not {{'text', 'answer_start'}} objects")
                pairs = [(x.get("text"), x.get("answer_start")) for x in answers]
                _add(split, path, qid, qa.get("question"), context, pairs)
    if not split.ids:
        raise DataError(f"{path}: no questions (SQuAD's layout: data → paragraphs → qas)")
    return split


def _read_records(path: str, raw: str) -> QuestionSplit:
    split = QuestionSplit(str(path), [], [], [], [])
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(
                f"{path}, line {number}: not JSON ({err.msg}); question answering reads SQuAD's JSON layout or "
                "JSON lines of {'id', 'question', 'context', 'answers': {'text': [...], 'answer_start': [...]}}"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get("answers", {}), dict):
            raise DataError(f"{path}, line {number}: expected an object with 'answers': {{'text', 'answer_start'}}")
        answers = record.get("answers") or {}
        texts, starts = answers.get("text") or [], answers.get("answer_start") or []
        if len(texts) != len(starts):
            raise DataError(f"{path}, line {number}: {len(texts)} answer texts but {len(starts)} answer starts")
        qid = str(record.get("id", f"line {number}"))
        _add(split, path, qid, record.get("question"), record.get("context"), list(zip(texts, starts)))
    return split


def _add(split: QuestionSplit, path: str, qid: str, question, context, answers: list) -> None:
    """One question, its answers checked against the context."""
    if not isinstance(question, str) or not isinstance(context, str):
        raise DataError(f"{path}: question {qid!r} has no 'question' or 'context' string")
    checked = []
    for text, start in answers:
        if not isinstance(text, str) or not isinstance(start, int) or isinstance(start, bool):
            raise DataError(f"{path}: question {qid!r}: answer {text!r} at {start!r} is not a text and an offset")
        if not 0 <= start <= start + len(text) <= len(context):
            raise DataError(
                f"{path}: question {qid!r}: answer {text!r} at {start} is outside the context "
                f"({len(context)} characters)"
            )
        if context[start : start + len(text)] != text:
            raise DataError(
                f"{path}: question {qid!r}: the context reads {context[start : start + len(text)]!r} at {start}, "
                f"not the answer {text!r}"
            )
        checked.append((text, start))
    split.ids.append(qid)
    split.questions.append(question)
    split.contexts.append(context)
    split.answers.append(checked)


def language_of(contexts: list[str]) -> str:
    """ "zh" when most of the contexts' non-space characters are CJK, else "en" (which metric scores answers)."""
    chars = [c for context in dict.fromkeys(contexts) for c in context if not c.isspace()]
    cjk = sum(is_cjk(ord(c)) for c in chars)
    return "zh" if chars and cjk > len(chars) / 2 else "en"


# ---------------------------------------------------------------------------------------------- encoding


@dataclass
class _Context:
    ids: list[int]
    starts: np.ndarray  # each piece's word's first character
    ends: np.ndarray  # and the character after its last


def _contexts(split: QuestionSplit, tokenizer) -> dict[str, _Context]:
    distinct = list(dict.fromkeys(split.contexts))
    words = [words_with_offsets(context) for context in distinct]
    pieces_of = word_pieces(tokenizer, [[w for w, _ in ws] for ws in words])
    out = {}
    for context, ws in zip(distinct, words):
        ids, starts, ends = [], [], []
        for word, offset in ws:
            pieces = pieces_of[word]
            ids.extend(pieces)
            starts.extend([offset] * len(pieces))
            ends.extend([offset + len(word)] * len(pieces))
        out[context] = _Context(ids, np.asarray(starts, np.int64), np.asarray(ends, np.int64))
    return out


def answer_pieces(context: _Context, start: int, end: int) -> tuple[int, int] | None:
    """The first and last piece of the characters [start, end) of the context; None when no piece covers them."""
    first = int(np.searchsorted(context.ends, start, side="right"))
    last = int(np.searchsorted(context.starts, end, side="left")) - 1
    return (first, last) if first <= last else None


def best_windows(num_pieces: int, spans: list[tuple[int, int]]) -> np.ndarray:
    """For each piece, the window in which it has the most context on its shorter side (the first such on ties),
    as the original BERT's SQuAD code picks where an answer may start: a piece at a window's edge reads half a
    sentence."""
    pieces = np.arange(num_pieces)[:, None]
    starts, ends = (np.asarray([s[i] for s in spans])[None, :] for i in (0, 1))
    context = np.where((starts <= pieces) & (pieces < ends), np.minimum(pieces - starts, ends - 1 - pieces), -1)
    return context.argmax(1) if num_pieces else np.zeros(0, np.int64)


def encode_questions(
    split: QuestionSplit, tokenizer, max_seq_length: int, doc_stride: int, max_question_length: int
) -> EncodedSplit:
    """Every question's windows as fixed-width arrays: input_ids, token_type_ids (1 from the context on), length,
    start_position and end_position (the first gold answer's pieces when the window holds it whole, else 0, the
    [CLS]), example (the question's index), piece_start and piece_end (each context piece's characters in the
    context, -1 elsewhere), max_context (1 where the window is the one in which that piece has the most context,
    `best_windows`) and row (the window's index)."""
    contexts = _contexts(split, tokenizer)
    questions = [ids[:max_question_length] for _, ids in tokenizer.tokenize_batch(split.questions)]
    rows = []
    for q, (question, context_text, answers) in enumerate(zip(questions, split.contexts, split.answers)):
        context = contexts[context_text]
        budget = max_seq_length - SPECIAL_PIECES - len(question)
        if budget <= doc_stride:
            raise ConfigError(
                f"data.max_seq_length {max_seq_length} leaves {budget} context pieces after a question of "
                f"{len(question)} pieces, not more than data.doc_stride {doc_stride}: raise max_seq_length or "
                "lower data.max_question_length or data.doc_stride"
            )
        span = None
        if answers:
            text, start = answers[0]
            span = answer_pieces(context, start, start + len(text))
            if span is None:
                raise DataError(f"{split.source}: question {split.ids[q]!r}: the answer {text!r} holds no token")
        spans = windows(len(context.ids), budget, doc_stride)
        owner = best_windows(len(context.ids), spans)
        for w, (a, b) in enumerate(spans):
            rows.append((q, question, context, a, b, span, owner[a:b] == w))
    n = len(rows)
    arrays = {
        "input_ids": np.full((n, max_seq_length), tokenizer.pad_id, dtype=np.int32),
        "token_type_ids": np.zeros((n, max_seq_length), dtype=np.int8),
        "length": np.empty(n, dtype=np.int32),
        "start_position": np.zeros(n, dtype=np.int32),
        "end_position": np.zeros(n, dtype=np.int32),
        "example": np.empty(n, dtype=np.int32),
        "piece_start": np.full((n, max_seq_length), -1, dtype=np.int32),
        "piece_end": np.full((n, max_seq_length), -1, dtype=np.int32),
        "max_context": np.zeros((n, max_seq_length), dtype=np.int8),
        "row": np.arange(n, dtype=np.int64),
    }
    for i, (q, question, context, a, b, span, owned) in enumerate(rows):
        offset = len(question) + 2  # the window's first piece, after [CLS] question [SEP]
        k = offset + b - a + 1
        arrays["input_ids"][i, :k] = [
            tokenizer.cls_id,
            *question,
            tokenizer.sep_id,
            *context.ids[a:b],
            tokenizer.sep_id,
        ]
        arrays["token_type_ids"][i, offset:k] = 1
        arrays["length"][i] = k
        arrays["example"][i] = q
        arrays["piece_start"][i, offset : k - 1] = context.starts[a:b]
        arrays["piece_end"][i, offset : k - 1] = context.ends[a:b]
        arrays["max_context"][i, offset : k - 1] = owned
        if span is not None and a <= span[0] and span[1] < b:
            arrays["start_position"][i] = offset + span[0] - a
            arrays["end_position"][i] = offset + span[1] - a
    return EncodedSplit(arrays)
