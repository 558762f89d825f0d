"""The JSON a served model reads and writes, with no Ray in it: `{"texts": [...]}` (plus `"text_pairs"` for a pair
model) in, `{"predictions": [...]}` out, one object per text in the order given."""

from __future__ import annotations

import json
from typing import Any

import numpy as np


class BadRequest(ValueError):
    """A request the server answers with 400 and this message."""


def parse_request(body: bytes, pair: bool, max_texts: int) -> tuple[list[str], list[str] | None]:
    """The texts (and pairs) of a request body; BadRequest naming what is wrong with it."""
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadRequest(f"the body is not JSON: {err}") from None
    if not isinstance(request, dict):
        raise BadRequest('the body must be a JSON object: {"texts": [...]}')
    texts = _strings(request, "texts")
    if len(texts) > max_texts:
        raise BadRequest(f"{len(texts)} texts in one request; at most {max_texts} (serve --max-batch-size)")
    if not pair:
        if "text_pairs" in request:
            raise BadRequest("this model is served for single texts: no text_pairs (serve --pair for a pair model)")
        return texts, None
    pairs = _strings(request, "text_pairs")
    if len(pairs) != len(texts):
        raise BadRequest(f"{len(texts)} texts but {len(pairs)} text_pairs: one pair per text")
    return texts, pairs


def _strings(request: dict, key: str) -> list[str]:
    if key not in request:
        raise BadRequest(f'the request has no "{key}": a list of strings')
    values = request[key]
    if not isinstance(values, list):
        raise BadRequest(f'"{key}" must be a list of strings, not {type(values).__name__}')
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise BadRequest(f'"{key}"[{i}] is {type(value).__name__}, not a string')
    return values


def predictions(columns: dict[str, np.ndarray], start: int, stop: int) -> list[dict[str, Any]]:
    """Rows `start:stop` of the prediction columns, one object per row (whatever columns the predictor adds)."""
    values = {name: column[start:stop].tolist() for name, column in columns.items()}
    return [dict(zip(values, row)) for row in zip(*values.values())]


def encode(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer, ensure_ascii=False, default=_plain).encode("utf-8")


def _plain(value: Any) -> Any:
    """NumPy values left inside object columns (a row's list of tags, say) as plain JSON values."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
