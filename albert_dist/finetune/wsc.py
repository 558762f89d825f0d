"""CLUEWSC2020 as sentence classification: each text with its two spans marked, as CLUE's baselines read it.

A row is `{"target": {"span1_text", "span1_index", "span2_text", "span2_index"}, "text", "label": "true" | "false"}`
(span1 a noun phrase, span2 a pronoun; the label says whether the pronoun refers to the noun). CLUE's baselines
(CLUEbenchmark/CLUE, baselines/models/classifier_utils.py, `WSCProcessor`) classify the text alone with the noun
between underscores and the pronoun between brackets: 这时候放在_床_上枕头旁边的手机响了……现在[它]突然响了。
The markers are plain characters every Chinese vocabulary holds, so a pretrained encoder reads them unchanged.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from albert_dist.errors import DataError

TARGET = "target"
#: (text, index) keys of each span, and the characters put around it
SPANS = (("span1_text", "span1_index", "_", "_"), ("span2_text", "span2_index", "[", "]"))


def marked_text(text: str, target: Any, where: str) -> str:
    """`text` with span1 between underscores and span2 between brackets; a span that is missing or does not read as
    its text at its index is a DataError naming `where` (the file and row)."""
    if not isinstance(target, dict):
        raise DataError(f"{where}: {TARGET!r} is not an object of span1_text, span1_index, span2_text, span2_index")
    inserts = []
    for text_key, index_key, opening, closing in SPANS:
        span, index = target.get(text_key), target.get(index_key)
        if not isinstance(span, str) or not span:
            raise DataError(f"{where}: {TARGET}.{text_key} is {span!r}, not a text")
        if not isinstance(index, int) or isinstance(index, bool):
            raise DataError(f"{where}: {TARGET}.{index_key} is {index!r}, not a character offset")
        if not 0 <= index <= index + len(span) <= len(text):
            raise DataError(
                f"{where}: {TARGET}.{text_key} {span!r} at {index_key} {index} runs outside the text "
                f"({len(text)} characters)"
            )
        if text[index : index + len(span)] != span:
            raise DataError(
                f"{where}: {TARGET}.{text_key} is {span!r}, but the text reads {text[index : index + len(span)]!r} "
                f"at {index_key} {index}"
            )
        # (position, 0 for a closing marker so that a span ending where the other starts closes first, marker)
        inserts += [(index, 1, opening), (index + len(span), 0, closing)]
    marked = text
    for position, _, marker in sorted(inserts, reverse=True):
        marked = marked[:position] + marker + marked[position:]
    return marked


def marked_texts(table: pa.Table, path: str, text_column: str = "text") -> list[str]:
    """Each row's `text_column` with its `target` spans marked (`marked_text`)."""
    missing = [name for name in (text_column, TARGET) if name not in table.column_names]
    if missing:
        raise DataError(
            f"{path}: no column {missing[0]!r} (CLUEWSC2020's layout: text, target, label); the file has "
            f"{', '.join(map(repr, table.column_names))}"
        )
    texts, targets = table.column(text_column).to_pylist(), table.column(TARGET).to_pylist()
    out = []
    for row, (text, target) in enumerate(zip(texts, targets), start=1):
        if not isinstance(text, str):
            raise DataError(f"{path}, row {row}: column {text_column!r} is {text!r}, not a text")
        out.append(marked_text(text, target, f"{path}, row {row}"))
    return out
