"""Documents to instances: split sentences, tokenize, build SOP instances (and static masks), one batch at a time.

`DocumentProcessor` is the Ray Data actor of the pipeline: it holds one tokenizer and, for Chinese whole-word
masking, one jieba dictionary, both loaded once per actor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from albert_dist.data.instances import InstanceSpec, create_instances, document_rng, stable_hash
from albert_dist.data.masking import MaskingCollator
from albert_dist.data.segment import JiebaSegmenter, word_starts
from albert_dist.data.sentences import cap_length, collapse_whitespace, split_sentences

INSTANCE_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("token_type_ids", pa.list_(pa.int8())),
        ("word_start", pa.list_(pa.bool_())),
        ("sop_label", pa.int8()),
    ]
)
STATIC_MASK_SCHEMA = pa.schema(
    [
        ("masked_input_ids", pa.list_(pa.int32())),
        ("masked_lm_positions", pa.list_(pa.int32())),
        ("masked_lm_ids", pa.list_(pa.int32())),
    ]
)


@dataclass(frozen=True)
class ProcessSettings:
    spec: InstanceSpec
    language: str = "auto"
    max_sentence_chars: int = 2000
    dupe_factor: int = 1
    eval_fraction: float = 0.0
    seed: int = 12345
    word_segmenter: str | None = None  # "jieba": Chinese whole words for masking
    user_dict: str | None = None  # the text of a jieba user dictionary


def document_sentences(text: str, presplit: bool, language: str, max_chars: int, counts: Counter) -> list[str]:
    """The document's sentences: its lines when the input is one sentence per line, else split; runaway
    sentences cut to `max_chars`."""
    if presplit:
        sentences = [s for s in map(collapse_whitespace, text.split("\n")) if s]
    else:
        sentences = split_sentences(text, language)
    capped = []
    for sentence in sentences:
        pieces = cap_length(sentence, max_chars)
        counts["long_sentences_cut"] += len(pieces) > 1
        capped.extend(pieces)
    return capped


def is_eval_document(doc_key: str, eval_fraction: float) -> bool:
    """Held out by a stable hash of the document key, so the split never depends on partitioning."""
    return stable_hash("eval:" + doc_key) < eval_fraction * 2**64


class DocumentProcessor:
    """Ray Data callable: a batch of documents → a table of instances (+ `is_eval`), counters sent to `tally`."""

    def __init__(
        self,
        tokenizer,
        settings: ProcessSettings,
        collator: MaskingCollator | None = None,
        tally: Callable[[Counter], None] | None = None,
    ):
        self.tokenizer, self.settings, self.collator, self.tally = tokenizer, settings, collator, tally
        self.segmenter = JiebaSegmenter(settings.user_dict) if settings.word_segmenter == "jieba" else None

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        counts: Counter = Counter()
        columns: dict[str, list] = {name: [] for name in self._schema().names}
        for doc_key, text, presplit in zip(batch["doc_key"], batch["text"], batch["presplit"]):
            self._document(str(doc_key), str(text), bool(presplit), columns, counts)
        if self.tally is not None:
            self.tally(counts)
        return pa.table(columns, schema=self._schema())

    def _schema(self) -> pa.Schema:
        schema = pa.schema([*INSTANCE_SCHEMA, ("is_eval", pa.bool_())])
        return pa.unify_schemas([schema, STATIC_MASK_SCHEMA]) if self.collator is not None else schema

    def _document(self, doc_key: str, text: str, presplit: bool, columns: dict[str, list], counts: Counter) -> None:
        s = self.settings
        sentences = document_sentences(text, presplit, s.language, s.max_sentence_chars, counts)
        ids, starts = [], []
        for sentence, (pieces, token_ids) in zip(sentences, self.tokenizer.tokenize_batch(sentences)):
            if not pieces:
                counts["empty_sentences"] += 1
                continue
            ids.append(np.array(token_ids, np.int32))
            starts.append(word_starts(self.tokenizer, pieces, token_ids, sentence, self.segmenter, counts))
        if not ids:
            counts["empty_documents"] += 1
            return
        counts["documents"] += 1
        counts["sentences"] += len(ids)
        counts["tokens"] += sum(len(x) for x in ids)
        counts["one_sentence_documents"] += len(ids) == 1
        is_eval = is_eval_document(doc_key, s.eval_fraction)
        counts["eval_documents"] += is_eval
        for copy in range(s.dupe_factor):
            rng = document_rng(s.seed, doc_key, copy)
            instances = create_instances(ids, starts, s.spec, rng, counts)
            if not instances:
                continue
            columns["input_ids"].extend(i.input_ids for i in instances)
            columns["token_type_ids"].extend(i.token_type_ids for i in instances)
            columns["word_start"].extend(i.word_start for i in instances)
            columns["sop_label"].extend(i.sop_label for i in instances)
            columns["is_eval"].extend([is_eval] * len(instances))
            if self.collator is not None:
                masks = self.collator.static_masks(
                    [i.input_ids for i in instances], [i.word_start for i in instances], rng
                )
                for name, values in zip(STATIC_MASK_SCHEMA.names, zip(*masks)):
                    columns[name].extend(values)


#: what went in and came out, in the order the summary gives them
THROUGHPUT_COUNTS = (
    "files",
    "bytes",
    "documents",
    "eval_documents",
    "sentences",
    "tokens",
    "instances",
    "train_instances",
    "eval_instances",
)


def summarize_counts(counts: dict[str, Any]) -> dict[str, Any]:
    """Counters in a fixed, readable order (absent ones as 0)."""
    order = [
        *THROUGHPUT_COUNTS,
        "replaced_chars",
        "empty_files",
        "empty_documents",
        "one_sentence_documents",
        "long_sentences_cut",
        "empty_sentences",
        "sentences_cut_in_two",
        "chunks_skipped_too_short",
        "tokens_truncated",
    ]
    return {key: int(counts.get(key, 0)) for key in order} | {k: v for k, v in counts.items() if k not in order}
