"""Tagged sentences for token classification (NER): reading them, aligning tags to word pieces, and cutting long
sentences into overlapping windows.

Inputs: CoNLL-style files (`token<TAB or space>tag` a line, a blank line between sentences: the People's Daily and
MSRA NER sets, one Chinese character a line), CLUENER2020 JSON lines (`{"text", "label": {type: {mention:
[[start, end]]}}}`, ends included) and JSONL or Parquet rows with a tokens column and a tags column. Tags are BIO,
BIOES, or BMES (whose `M-` is read as `I-`).

Each word is tokenized on its own; its first piece carries its tag and the rest are left out of the loss (-100),
as transformers' `run_ner` does. A word the vocabulary cannot spell (or that tokenizes to nothing, a space) is one
`[UNK]`, still tagged, so words and predictions stay aligned. A sentence longer than the model's length is cut into
windows of `max_seq_length - 2` pieces that overlap by `doc_stride` pieces; each word is scored by the window in
which it has the most context on both sides (`word_index` marks that window's positions), so evaluation and
prediction put the sentence back together word for word.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from albert_dist.data.batching import EncodedSplit, windows
from albert_dist.errors import DataError
from albert_dist.finetune import entities
from albert_dist.finetune.data import read_table, require_columns
from albert_dist.model import IGNORE_INDEX
from albert_dist.storage import filesystem
from albert_dist.text_encoding import first_undecodable, not_utf8_error
from albert_dist.tokenizer.backends import is_cjk

CONLL_SUFFIXES = {".conll", ".bio", ".bioes", ".bmes", ".txt", ".char", ".ner"}


@dataclass
class TaggedSplit:
    """Sentences of one split as words and tags (tags None when unlabelled); `lines` holds where each sentence
    starts in its file (a line number, or a row number for tables), for errors."""

    source: str
    words: list[list[str]]
    tags: list[list[str]] | None
    lines: list[int]

    def __len__(self) -> int:
        return len(self.words)

    def take(self, indices: np.ndarray, source: str) -> TaggedSplit:
        pick = lambda values: [values[i] for i in indices]  # noqa: E731
        return TaggedSplit(
            source, pick(self.words), pick(self.tags) if self.tags is not None else None, pick(self.lines)
        )


def tagged_format(path: str, fmt: str, data) -> str:
    """conll, cluener or columns (JSONL/Parquet rows with data.tokens_column and data.tags_column)."""
    if fmt in ("conll", "cluener"):
        return fmt
    if fmt in ("jsonl", "parquet"):
        return "columns"
    if fmt in ("csv", "tsv"):
        raise DataError(f"{path}: token classification reads CoNLL, CLUENER JSON, JSONL or Parquet, not {fmt}")
    suffix = Path(path).suffix.lower()
    if suffix in CONLL_SUFFIXES:
        return "conll"
    if suffix in (".parquet", ".pq"):
        return "columns"
    if suffix in (".json", ".jsonl", ".ndjson"):
        first = next((line for line in _lines(path) if line.strip()), "{}")
        try:
            record = json.loads(first)
        except json.JSONDecodeError:
            raise DataError(f"{path}: line 1 is not JSON") from None
        return "columns" if isinstance(record, dict) and data.tokens_column in record else "cluener"
    raise DataError(
        f"{path}: cannot tell the format from {suffix or 'no extension'!r}; set data.format to conll, cluener, "
        "jsonl or parquet"
    )


def read_tagged(path: str, data, labelled: bool = True) -> TaggedSplit:
    """One file of a token-classification task, in the format data.format says (or its extension tells)."""
    kind = tagged_format(path, data.format, data)
    if kind == "conll":
        return _read_conll(path, labelled)
    if kind == "cluener":
        return _read_cluener(path, labelled)
    return _read_columns(path, data, labelled)


def _lines(path: str) -> list[str]:
    fs, inner = filesystem(str(path))
    try:
        with fs.open_input_stream(inner) as stream:
            raw = stream.read()
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from None
    undecodable = first_undecodable(raw)
    if undecodable:
        raise not_utf8_error(path, raw, undecodable)
    if not raw.strip():
        raise DataError(f"data file is empty: {path}")
    return raw.decode("utf-8-sig").splitlines()


def _checked_tag(tag: str, path: str, line: int) -> str:
    """The tag with BMES's M- read as I-; one that does not parse is a DataError naming file and line."""
    tag = "I-" + tag[2:] if tag.startswith("M-") else tag
    try:
        entities.parse_tag(tag)
    except ValueError as err:
        raise DataError(f"{path}, line {line}: {err}") from None
    return tag


def _read_conll(path: str, labelled: bool) -> TaggedSplit:
    words: list[list[str]] = []
    tags: list[list[str]] = []
    lines: list[int] = []
    sentence: list[str] = []
    sentence_tags: list[str] = []
    for number, line in enumerate([*_lines(path), ""], start=1):
        if not line.strip() or line.startswith("-DOCSTART-"):
            if sentence:
                words.append(sentence)
                tags.append(sentence_tags)
                sentence, sentence_tags = [], []
            continue
        if not sentence:
            lines.append(number)
        # the last field is the tag; a token may itself be a space (People's Daily keeps full-width spaces)
        token, _, tag = line.rstrip("\r\n").rpartition("\t") if "\t" in line else line.strip().rpartition(" ")
        if labelled and not token:
            raise DataError(f"{path}, line {number}: expected 'token<TAB>tag', got {line.strip()!r}")
        if not labelled and not token:
            token, tag = tag, "O"
        sentence.append(token or " ")
        sentence_tags.append(_checked_tag(tag, path, number) if labelled else "O")
    if not words:
        raise DataError(f"{path}: no sentences (token<TAB>tag lines, a blank line between sentences)")
    return TaggedSplit(str(path), words, tags if labelled else None, lines)


def _read_cluener(path: str, labelled: bool) -> TaggedSplit:
    words: list[list[str]] = []
    tags: list[list[str]] = []
    lines: list[int] = []
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}, line {number}: not JSON ({err.msg})") from None
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise DataError(f"{path}, line {number}: no 'text' string (CLUENER's layout: {{'text', 'label'}})")
        words.append(list(text))
        lines.append(number)
        if labelled:
            try:
                tags.append(entities.tags_from_spans(len(text), _cluener_spans(record, text, path, number)))
            except ValueError as err:  # overlapping mentions
                raise DataError(f"{path}, line {number}: {err}") from None
    if not words:
        raise DataError(f"{path}: no records")
    return TaggedSplit(str(path), words, tags if labelled else None, lines)


def _cluener_spans(record: dict, text: str, path: str, line: int) -> list[entities.Entity]:
    label = record.get("label")
    if not isinstance(label, dict):
        raise DataError(f"{path}, line {line}: no 'label' object (type → mention → [[start, end]])")
    spans = []
    for kind, mentions in label.items():
        for mention, positions in (mentions or {}).items():
            for position in positions:
                if not (
                    isinstance(position, list) and len(position) == 2 and all(isinstance(p, int) for p in position)
                ):
                    raise DataError(f"{path}, line {line}: {kind} {mention!r}: {position!r} is not [start, end]")
                start, end = position
                if not 0 <= start <= end < len(text):
                    raise DataError(
                        f"{path}, line {line}: {kind} {mention!r} at [{start}, {end}] is outside the text "
                        f"({len(text)} characters)"
                    )
                if text[start : end + 1] != mention:
                    raise DataError(
                        f"{path}, line {line}: {kind} at [{start}, {end}] reads {text[start : end + 1]!r}, "
                        f"not {mention!r}"
                    )
                spans.append((kind, start, end))
    return spans


def _read_columns(path: str, data, labelled: bool) -> TaggedSplit:
    table = read_table(path, "parquet" if Path(path).suffix.lower() in (".parquet", ".pq") else "jsonl")
    require_columns(table, path, tokens_column=data.tokens_column, tags_column=data.tags_column if labelled else None)
    words = table.column(data.tokens_column).to_pylist()
    tags = table.column(data.tags_column).to_pylist() if labelled else None
    for row, sentence in enumerate(words):
        if not isinstance(sentence, list) or not all(isinstance(w, str) for w in sentence):
            raise DataError(f"{path}, row {row + 1}: column {data.tokens_column!r} is not a list of strings")
        if labelled:
            if not isinstance(tags[row], list) or len(tags[row]) != len(sentence):
                raise DataError(
                    f"{path}, row {row + 1}: {len(sentence)} tokens but "
                    f"{len(tags[row]) if isinstance(tags[row], list) else 'no list of'} tags"
                )
            tags[row] = [_checked_tag(str(tag), path, row + 1) for tag in tags[row]]
    return TaggedSplit(str(path), words, tags, list(range(1, len(words) + 1)))


# ------------------------------------------------------------------------------------------------ labels


def tag_names(train: TaggedSplit, given: list[str] | None) -> list[str]:
    """Tags in id order: `given`, else "O" then the train tags sorted by entity type, then prefix."""
    if given:
        return list(given)
    seen = {tag for sentence in train.tags for tag in sentence} - {"O"}
    return ["O", *sorted(seen, key=lambda tag: (tag[2:], "BIES".index(tag[0])))]


def tag_ids(split: TaggedSplit, label2id: dict[str, int]) -> list[list[int]]:
    """Tag ids of every sentence; a tag the label set lacks is a DataError naming its file and line."""
    out = []
    for sentence, line in zip(split.tags, split.lines):
        unknown = next((tag for tag in sentence if tag not in label2id), None)
        if unknown is not None:
            raise DataError(
                f"{split.source}, sentence at line {line}: tag {unknown!r} is not in the label set "
                f"({', '.join(label2id)}): train and this file use different labels (set data.labels to name them all)"
            )
        out.append([label2id[tag] for tag in sentence])
    return out


# ---------------------------------------------------------------------------------------------- encoding


def word_pieces(tokenizer, words: list[list[str]]) -> dict[str, list[int]]:
    """The piece ids of every distinct word (a word the tokenizer drops entirely is one [UNK])."""
    distinct = sorted({word for sentence in words for word in sentence})
    encoded = tokenizer.tokenize_batch(distinct)
    return {word: (ids or [tokenizer.unk_id]) for word, (_, ids) in zip(distinct, encoded)}


def encode_tagged(
    split: TaggedSplit,
    tokenizer,
    max_seq_length: int,
    doc_stride: int,
    sentence_tag_ids: list[list[int]] | None,
) -> EncodedSplit:
    """Windows of every sentence as fixed-width arrays: input_ids, token_type_ids, length, label (-100 off the
    first piece of a word), word_index (the global index of the word this window scores, -1 elsewhere), sentence
    and row (the window's index)."""
    pieces_of = word_pieces(tokenizer, split.words)
    budget = max_seq_length - 2
    rows: list[tuple[list[int], list[int], list[int]]] = []
    sentence_of: list[int] = []
    first_word = 0
    for s, sentence in enumerate(split.words):
        ids: list[int] = []
        starts: list[int] = []  # the piece where each word starts
        for word in sentence:
            starts.append(len(ids))
            ids.extend(pieces_of[word])
        tag_row = sentence_tag_ids[s] if sentence_tag_ids is not None else [IGNORE_INDEX] * len(sentence)
        spans = windows(len(ids), budget, doc_stride)
        owner = [_best_window(p, spans) for p in starts]
        for w_index, (start, end) in enumerate(spans):
            labels = [IGNORE_INDEX] * (end - start)
            scored = [-1] * (end - start)
            for word, p in enumerate(starts):
                if start <= p < end:
                    labels[p - start] = tag_row[word]
                    if owner[word] == w_index:
                        scored[p - start] = first_word + word
            rows.append((ids[start:end], labels, scored))
            sentence_of.append(s)
        first_word += len(sentence)
    n = len(rows)
    arrays = {
        "input_ids": np.full((n, max_seq_length), tokenizer.pad_id, dtype=np.int32),
        "token_type_ids": np.zeros((n, max_seq_length), dtype=np.int8),
        "length": np.empty(n, dtype=np.int32),
        "label": np.full((n, max_seq_length), IGNORE_INDEX, dtype=np.int16),
        "word_index": np.full((n, max_seq_length), -1, dtype=np.int32),
        "sentence": np.asarray(sentence_of, dtype=np.int32),
        "row": np.arange(n, dtype=np.int64),
    }
    for i, (ids, labels, scored) in enumerate(rows):
        k = len(ids) + 2
        arrays["input_ids"][i, :k] = [tokenizer.cls_id, *ids, tokenizer.sep_id]
        arrays["label"][i, 1 : k - 1] = labels
        arrays["word_index"][i, 1 : k - 1] = scored
        arrays["length"][i] = k
    return EncodedSplit(arrays)


def _best_window(piece: int, spans: list[tuple[int, int]]) -> int:
    """The window holding `piece` with the most context on its shorter side (the first such on ties)."""
    context = [min(piece - start, end - 1 - piece) if start <= piece < end else -1 for start, end in spans]
    return int(np.argmax(context))


def words_per_sentence(encoded: EncodedSplit) -> np.ndarray:
    """How many words each sentence has, read back from the windows (every word is scored by one window)."""
    scored = encoded.arrays["word_index"] >= 0
    sentences = np.broadcast_to(encoded.arrays["sentence"][:, None], scored.shape)[scored]
    return np.bincount(sentences, minlength=int(encoded.arrays["sentence"].max()) + 1)


# ------------------------------------------------------------------------------------------- raw text


def words_with_offsets(text: str) -> list[tuple[str, int]]:
    """Raw text as words the way the NER data is split: each CJK character, each punctuation mark and each run of
    other non-space characters is a word; with the character offset where it starts."""
    out: list[tuple[str, int]] = []
    start = None
    for i, char in enumerate(text):
        alone = is_cjk(ord(char)) or unicodedata.category(char).startswith("P")
        if char.isspace() or alone:
            if start is not None:
                out.append((text[start:i], start))
                start = None
            if alone:
                out.append((char, i))
        elif start is None:
            start = i
    if start is not None:
        out.append((text[start:], start))
    return out
