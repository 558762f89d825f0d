"""The token-classification (NER) task: a tag per word on top of a pretrained ALBERT, scored by entities.

Evaluation statistics stay additive, as the loop needs them: each dev word is scored by exactly one window
(`token_data.encode_tagged`), so two tables indexed by dev word, filled with `1 + predicted tag` and `1 + gold tag`
at the positions that score a word and 0 elsewhere, sum over batches and ranks into every word's prediction and
gold tag. Entities are read from them once everything is summed (`score_words`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from albert_dist.data import batching
from albert_dist.finetune import entities, inference, token_data
from albert_dist.finetune.task import ClassificationSpec, SequenceClassificationTask
from albert_dist.model import IGNORE_INDEX, AlbertForTokenClassification
from albert_dist.storage import fetch_dir
from albert_dist.train import precision as amp


@dataclass(frozen=True)
class TokenClassificationSpec(ClassificationSpec):
    """A fine-tuning job's NER task; `eval_rows` counts the dev set's words."""

    label_names: tuple[str, ...] = ()
    scheme: str = "BIO"

    def build(self, rank: int, world_size: int, dataset: Callable[[str], Any]) -> TokenClassificationTask:
        return TokenClassificationTask(self, rank, world_size, dataset)


class TokenClassificationTask(SequenceClassificationTask):
    eval_columns = ("row", "word_index", "sentence")

    def build_model(self) -> torch.nn.Module:
        return AlbertForTokenClassification.from_pretrained(fetch_dir(self.spec.init_from), **self.spec.model_overrides)

    def statistics(self, logits: torch.Tensor, loss: torch.Tensor, batch) -> dict[str, torch.Tensor]:
        labels = batch["label"].long()
        labelled = labels != IGNORE_INDEX
        count = labelled.sum().float()
        predicted = logits.detach().argmax(-1)
        stats = {
            "loss_sum": loss.detach().float() * count,
            "count": count,
            "correct": ((predicted == labels) & labelled).sum().float(),
        }
        if "word_index" in batch:  # evaluation: entities need every word's tag
            size = self.spec.eval_rows
            words = batch["word_index"].long()
            slot = torch.where(words >= 0, words, size).flatten()  # unscored positions land in a slot cut off below
            scored = (words >= 0).float().flatten()
            stats["prediction_table"] = _table(slot, (predicted.flatten() + 1) * scored, size)
            stats["target_table"] = _table(slot, (labels.flatten() + 1) * scored, size)
        return stats

    def summarize(self, sums):
        count = max(1.0, sums.get("count", 0.0))
        # over the labelled positions while training (a word in two windows counts twice), over words once scored
        out = {"loss": sums.get("loss_sum", 0.0) / count, "accuracy": sums.get("correct", 0.0) / count}
        if "prediction_table" in sums:
            predicted = np.asarray(sums["prediction_table"]).round().astype(np.int64) - 1
            gold = np.asarray(sums["target_table"]).round().astype(np.int64) - 1
            lengths = token_data.words_per_sentence(batching.EncodedSplit(self._rows("dev")))
            out.update(score_words(predicted, gold, lengths, self.spec.label_names, self.spec.scheme))
        return out


def _table(slot: torch.Tensor, values: torch.Tensor, size: int) -> torch.Tensor:
    """A table of `size` entries holding `values` at `slot` (slot `size`, the unscored positions, dropped)."""
    table = torch.zeros(size + 1, device=values.device)
    return table.scatter_add_(0, slot, values.float())[:size]


def score_words(
    predicted: np.ndarray, gold: np.ndarray, lengths: np.ndarray, label_names: Iterable[str], scheme: str
) -> dict[str, float]:
    """Entity-level precision, recall and F1 (overall and `<type>_f1`) and word accuracy, from every word's
    predicted and gold tag id in sentence order and each sentence's word count."""
    names = np.asarray(list(label_names), dtype=object)
    bounds = np.cumsum(lengths)[:-1]
    predicted_tags = [list(part) for part in np.split(names[predicted], bounds)]
    gold_tags = [list(part) for part in np.split(names[gold], bounds)]
    out = entities.entity_metrics(gold_tags, predicted_tags, scheme)
    out["accuracy"] = float((predicted == gold).mean()) if len(gold) else 0.0
    return out


@torch.no_grad()
def word_predictions(
    model: torch.nn.Module,
    encoded: batching.EncodedSplit,
    batch_size: int = 64,
    pad_to_multiple_of: int = 8,
    precision: str = "fp32",
    on_batch: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every scored word's predicted tag id and its probability, indexed by `word_index`, from windows run in
    batches of similar length."""
    device = inference.eval_device(model)
    precision = amp.resolve_precision(precision, device)
    words = encoded.arrays["word_index"]
    size = int(words.max()) + 1 if words.size else 0
    tags, scores = np.zeros(size, np.int64), np.zeros(size, np.float32)
    order = batching.length_sorted_order(encoded.arrays["length"])
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        batch = batching.collate(
            {k: encoded.arrays[k][index] for k in ("input_ids", "token_type_ids", "length")}, pad_to_multiple_of
        )
        with amp.autocast(precision, device):
            logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
        probabilities = torch.softmax(logits.float(), -1).cpu().numpy()
        rows = words[index][:, : probabilities.shape[1]]
        scored = rows >= 0
        tags[rows[scored]] = probabilities.argmax(-1)[scored]
        scores[rows[scored]] = probabilities.max(-1)[scored]
        if on_batch:
            on_batch(len(index))
    return tags, scores


def evaluate_tokens(model, encoded: batching.EncodedSplit, label_names, scheme: str, **kwargs) -> dict[str, float]:
    """Entity metrics of `model` on an encoded, labelled split (the published model's dev and test scores)."""
    predicted, _ = word_predictions(model, encoded, **kwargs)
    scored = encoded.arrays["word_index"] >= 0
    gold = np.zeros(len(predicted), np.int64)
    gold[encoded.arrays["word_index"][scored]] = encoded.arrays["label"][scored]
    return score_words(predicted, gold, token_data.words_per_sentence(encoded), label_names, scheme)


def text_entities(
    model, tokenizer, texts: list[str], max_seq_length: int, overlap: int, **kwargs
) -> list[list[dict[str, Any]]]:
    """Each raw text's entities in the layout of transformers' token-classification pipeline: type, character
    `start` and `end` (end excluded), the `text` and `score` (the mean of its words' tag probabilities). Tags are read
    strictly, as the entity metrics read them: an `I-X` after `O` opens no entity, where the pipeline's
    aggregation ("first") opens one; on well-formed tags the two agree. Texts are split into words as the NER data
    is (`token_data.words_with_offsets`)."""
    split_words = [token_data.words_with_offsets(text) for text in texts]
    split = token_data.TaggedSplit("texts", [[w for w, _ in words] for words in split_words], None, [])
    encoded = token_data.encode_tagged(split, tokenizer, max_seq_length, overlap, None)
    tags, scores = word_predictions(model, encoded, **kwargs)
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    scheme = entities.scheme_of(names)
    out, first = [], 0
    for text, words in zip(texts, split_words):
        sentence_tags = [names[t] for t in tags[first : first + len(words)]]
        found = []
        for kind, a, b in entities.entities(sentence_tags, scheme):
            start, end = words[a][1], words[b][1] + len(words[b][0])
            score = float(scores[first + a : first + b + 1].mean())
            found.append({"type": kind, "start": start, "end": end, "text": text[start:end], "score": score})
        out.append(found)
        first += len(words)
    return out
