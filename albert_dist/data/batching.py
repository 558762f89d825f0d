"""Texts to padded model batches: encoding, length-grouped orders, collation. Shared by fine-tuning, prediction and the
encoder's MLflow model."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

MEGA_BATCH_MULTIPLE = 50  # at most this many batches per length-sorted mega-batch, as transformers' group_by_length


def encode_texts(tokenizer, texts: list[str], pairs: list[str] | None, max_seq_length: int) -> dict[str, np.ndarray]:
    """`input_ids`, `token_type_ids` padded to `max_seq_length` and each row's `length`."""
    n = len(texts)
    input_ids = np.full((n, max_seq_length), tokenizer.pad_id, dtype=np.int32)
    token_type_ids = np.zeros((n, max_seq_length), dtype=np.int8)
    lengths = np.empty(n, dtype=np.int32)
    for i, row in enumerate(tokenizer.encode_pairs(texts, pairs, max_seq_length)):
        k = len(row["input_ids"])
        input_ids[i, :k], token_type_ids[i, :k], lengths[i] = row["input_ids"], row["token_type_ids"], k
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "length": lengths}


def windows(num_pieces: int, budget: int, overlap: int) -> list[tuple[int, int]]:
    """[start, end) piece ranges of at most `budget` pieces covering `num_pieces`, consecutive ones sharing
    `overlap` pieces (the last one ends at the end)."""
    if num_pieces <= budget:
        return [(0, num_pieces)]
    step = max(1, budget - overlap)
    starts = list(range(0, num_pieces - budget, step)) + [num_pieces - budget]
    return [(start, start + budget) for start in starts]


def encode_windows(tokenizer, texts: list[str], max_seq_length: int, overlap: int) -> dict[str, np.ndarray]:
    """As `encode_texts`, with each text longer than the model read as overlapping windows of `max_seq_length - 2`
    pieces, one row each; `document` holds the index of the text a row reads."""
    rows, documents = [], []
    for document, (_, ids) in enumerate(tokenizer.tokenize_batch(texts)):
        for start, end in windows(len(ids), max_seq_length - 2, overlap):
            rows.append([tokenizer.cls_id, *ids[start:end], tokenizer.sep_id])
            documents.append(document)
    input_ids = np.full((len(rows), max_seq_length), tokenizer.pad_id, dtype=np.int32)
    lengths = np.empty(len(rows), dtype=np.int32)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)], lengths[i] = row, len(row)
    return {
        "input_ids": input_ids,
        "token_type_ids": np.zeros_like(input_ids, dtype=np.int8),
        "length": lengths,
        "document": np.asarray(documents, dtype=np.int64),
    }


def document_means(values: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """The mean of each document's rows of `values` (documents numbered 0..D-1, in row order of first sight)."""
    count = int(documents.max()) + 1 if len(documents) else 0
    sums = np.zeros((count, *values.shape[1:]), dtype=np.float64)
    np.add.at(sums, documents, values)
    return (sums / np.bincount(documents, minlength=count).reshape(-1, *[1] * (values.ndim - 1))).astype(values.dtype)


@dataclass
class EncodedSplit:
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrays["length"])


def collate(rows: dict[str, np.ndarray], pad_to_multiple_of: int) -> dict[str, torch.Tensor]:
    """Model inputs cut to the longest row, rounded up to `pad_to_multiple_of`, with the attention mask."""
    lengths = torch.as_tensor(rows["length"], dtype=torch.long)
    full = rows["input_ids"].shape[1]
    width = min(full, -(-int(lengths.max()) // pad_to_multiple_of) * pad_to_multiple_of)
    batch = {
        "input_ids": torch.as_tensor(rows["input_ids"][:, :width], dtype=torch.long),
        "token_type_ids": torch.as_tensor(rows["token_type_ids"][:, :width], dtype=torch.long),
        "attention_mask": (torch.arange(width)[None, :] < lengths[:, None]).long(),
    }
    for key in ("label", "row", "word_index", "document"):
        if key in rows:  # per-position columns (token labels) are cut like the inputs
            values = rows[key][:, :width] if rows[key].ndim == 2 else rows[key]
            batch[key] = torch.as_tensor(values)
    return batch


def length_grouped_order(lengths: np.ndarray, batch_size: int, rng: np.random.Generator, bucket: int = 8) -> np.ndarray:
    """A random order of the rows in which each run of `batch_size` rows has similar lengths, as transformers'
    `group_by_length`: a permutation cut into mega-batches of up to `MEGA_BATCH_MULTIPLE` batches (fewer for small
    splits, so that an epoch has at least 4), each sorted longest first. Lengths are compared rounded up to
    `bucket` (the collator pads to that multiple anyway), so rows of one bucket stay in random order: where the
    length tells the label apart, batches do not turn into runs of one label. The full batches are then shuffled,
    so that batch width does not trend through the epoch; a partial batch stays last (where `drop_last` drops it).
    Depends only on `rng`'s state: resume replays it exactly."""
    order = rng.permutation(len(lengths))
    widths = -(-np.asarray(lengths) // bucket)
    mega = batch_size * max(1, min(len(lengths) // (4 * batch_size), MEGA_BATCH_MULTIPLE))
    for start in range(0, len(order), mega):
        chunk = order[start : start + mega]
        order[start : start + mega] = chunk[np.argsort(-widths[chunk], kind="stable")]
    full = len(order) // batch_size * batch_size
    shuffled = order[:full].reshape(-1, batch_size)[rng.permutation(full // batch_size)].reshape(-1)
    return np.concatenate([shuffled, order[full:]])


def length_sorted_order(lengths: np.ndarray) -> np.ndarray:
    """Rows longest first (stable): batches of near-equal width where the order does not change the result."""
    return np.argsort(-np.asarray(lengths), kind="stable")


def batches(encoded: EncodedSplit, batch_size: int, pad_to_multiple_of: int, order: np.ndarray | None = None):
    """In-process batches of an encoded split, in `order` (default: row order)."""
    for start in range(0, len(encoded), batch_size):
        index = slice(start, start + batch_size) if order is None else order[start : start + batch_size]
        yield collate({k: v[index] for k, v in encoded.arrays.items()}, pad_to_multiple_of)
