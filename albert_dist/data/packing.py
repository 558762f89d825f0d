"""Packing a masked pretraining batch: several SOP instances per row, up to `max_seq_length` tokens.

A prepared instance is often shorter than `max_seq_length` (short documents, `short_seq_prob`), and a padded batch
computes its padding. Packing lays the batch's instances end to end in as few rows as first-fit-decreasing finds
and records what keeps each instance on its own: `position_ids` restarting at 0 for each instance, `sequence_ids`
(a number per instance, 0 on padding) from which the model builds a block-diagonal attention mask, and
`cls_positions` (where each instance's [CLS] landed, in the batch's original order) for sentence-order prediction.
Masking happens before packing, so the masked tokens, the labels and hence the losses are those of the unpacked
batch; only the layout changes.
"""

from __future__ import annotations

import numpy as np
import torch

from albert_dist.data.masking import IGNORE_INDEX

#: what a packed batch adds, the extra inputs of `AlbertForPreTraining.forward`
PACKED_INPUTS = ("position_ids", "sequence_ids", "cls_positions")

#: `data.packing: auto` packs a batch when its packed rows hold at most this share of the token slots its padded
#: rows hold (rows x width: a padded batch is as wide as its longest instance). Batches of short documents fall
#: below it, and packing them paid on every corpus measured; nearly full batches stay padded, where packing gained
#: nothing measurable and its attention mask is per pair of tokens, not per token (benchmarks/README.md#bench_packing).
AUTO_MAX_SLOT_SHARE = 0.8


def first_fit(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(row, offset) of each length and the number of rows: first fit, longest first, rows of `capacity`."""
    if lengths.size and int(lengths.max()) > capacity:
        raise ValueError(f"an instance of {int(lengths.max())} tokens does not fit rows of {capacity}")
    rows, offsets = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    free = np.zeros(len(lengths), np.int64)  # room left in each row opened so far
    used = 0
    for i in np.argsort(-lengths, kind="stable"):
        fitting = np.flatnonzero(free[:used] >= lengths[i])
        row = int(fitting[0]) if fitting.size else used
        if row == used:
            free[used], used = capacity, used + 1
        rows[i], offsets[i] = row, capacity - free[row]
        free[row] -= lengths[i]
    return rows, offsets, used


def packed_layout(
    lengths: np.ndarray, capacity: int, pad_to_multiple_of: int
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(row, offset) of each instance of `lengths`, the number of rows and their width (the last instance's end,
    rounded up to a multiple of `pad_to_multiple_of`)."""
    rows, offsets, n_rows = first_fit(lengths, capacity)
    ends = offsets + lengths
    return rows, offsets, n_rows, -(-int(ends.max(initial=1)) // pad_to_multiple_of) * pad_to_multiple_of


def packing_pays(n_rows: int, width: int, padded_slots: int) -> bool:
    """Whether `n_rows` packed rows of `width` tokens spare enough of the padded batch's `padded_slots` to pay
    (`AUTO_MAX_SLOT_SHARE`)."""
    return n_rows * width <= AUTO_MAX_SLOT_SHARE * padded_slots


def pack_batch(
    batch: dict[str, torch.Tensor],
    capacity: int,
    pad_id: int,
    pad_to_multiple_of: int = 8,
    only_if_it_pays: bool = False,
) -> dict[str, torch.Tensor]:
    """The packed layout of a `MaskingCollator` batch (rows of at most `capacity` tokens, padded to a multiple of
    `pad_to_multiple_of`); `sentence_order_label` keeps the instances' order, which `cls_positions` follows. With
    `only_if_it_pays`, the batch as it came when packing does not pay (`packing_pays`)."""
    lengths = batch["attention_mask"].sum(dim=1).numpy()
    rows, offsets, n_rows, width = packed_layout(lengths, capacity, pad_to_multiple_of)
    if only_if_it_pays and not packing_pays(n_rows, width, batch["attention_mask"].numel()):
        return batch
    instance = np.repeat(np.arange(len(lengths)), lengths)  # source row of every real token
    position = np.arange(len(instance)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    target = (rows[instance], offsets[instance] + position)

    def laid_out(values: np.ndarray, fill: int) -> torch.Tensor:
        out = np.full((n_rows, width), fill, np.int64)
        out[target] = values
        return torch.from_numpy(out)

    def moved(name: str, fill: int) -> torch.Tensor:
        return laid_out(batch[name].numpy()[instance, position], fill)

    return {
        "input_ids": moved("input_ids", pad_id),
        "attention_mask": laid_out(1, 0),
        "token_type_ids": moved("token_type_ids", 0),
        "labels": moved("labels", IGNORE_INDEX),
        "position_ids": laid_out(position, 0),
        "sequence_ids": laid_out(instance + 1, 0),
        "cls_positions": torch.from_numpy(rows * width + offsets),
        "sentence_order_label": batch["sentence_order_label"],
    }
