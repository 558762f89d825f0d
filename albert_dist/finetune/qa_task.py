"""The extractive question-answering task: start and end logits over the pieces of `[CLS] question [SEP] context
[SEP]` windows, scored by exact match and F1 of the decoded answers.

Evaluation statistics stay additive, as the loop needs them: two tables indexed by [dev window, position] hold the
start and end logits (each window is evaluated once, so its row of the summed tables is its own logits). Answers
are decoded from them once everything is summed (`best_answers`): per window the best span among the n-best
starts × ends inside the context (end ≥ start, at most `max_answer_length` pieces), per question the best over its
windows; where the training data holds unanswerable questions (SQuAD v2), no answer when [CLS]'s start + end (the
lowest over the question's windows) beats the best span's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from albert_dist.data import batching
from albert_dist.finetune import inference, qa_data, qa_metrics
from albert_dist.finetune.task import ClassificationSpec, SequenceClassificationTask, global_batches
from albert_dist.model import AlbertForQuestionAnswering
from albert_dist.storage import fetch_dir
from albert_dist.train import precision as amp

INPUTS = ("input_ids", "token_type_ids", "length")
N_BEST = 20  # starts and ends tried per window, as run_qa's n_best_size


@dataclass(frozen=True)
class QuestionAnsweringSpec(ClassificationSpec):
    """A fine-tuning job's QA task; `eval_rows` counts the dev windows, `gold` scores the dev answers."""

    gold: qa_data.Gold | None = None
    language: str = "zh"
    max_answer_length: int = 30
    allow_no_answer: bool = False

    def build(self, rank: int, world_size: int, dataset: Callable[[str], Any]) -> QuestionAnsweringTask:
        return QuestionAnsweringTask(self, rank, world_size, dataset)


@dataclass
class Answer:
    text: str
    start: int  # characters of the context, end excluded; -1 for no answer
    end: int
    score: float


class QuestionAnsweringTask(SequenceClassificationTask):
    eval_columns = ("row", "example", "piece_start", "piece_end")

    def build_model(self) -> torch.nn.Module:
        return AlbertForQuestionAnswering.from_pretrained(fetch_dir(self.spec.init_from), **self.spec.model_overrides)

    def loss(self, model, batch):
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            start_positions=batch["start_position"],
            end_positions=batch["end_position"],
        )
        return out.loss, self.statistics(out.start_logits, out.end_logits, out.loss, batch)

    def statistics(self, start_logits, end_logits, loss, batch) -> dict[str, torch.Tensor]:
        n = batch["input_ids"].shape[0]
        stats = {"loss_sum": loss.detach().float() * n, "count": float(n)}
        if "row" in batch:  # evaluation: answers are decoded from every window's logits
            rows, size, full = batch["row"].long(), self.spec.eval_rows, self.spec.max_seq_length
            for name, logits in (("start_table", start_logits), ("end_table", end_logits)):
                padded = F.pad(logits.detach().float(), (0, full - logits.shape[1]))
                stats[name] = torch.zeros(size, full, device=logits.device).index_add_(0, rows, padded)
        return stats

    def summarize(self, sums):
        out = {"loss": sums.get("loss_sum", 0.0) / max(1.0, sums.get("count", 0.0))}
        if "start_table" in sums:
            full = self.spec.max_seq_length
            start = np.asarray(sums["start_table"], np.float32).reshape(-1, full)
            end = np.asarray(sums["end_table"], np.float32).reshape(-1, full)
            spec = self.spec
            settings = dict(
                language=spec.language, max_answer_length=spec.max_answer_length, allow_no_answer=spec.allow_no_answer
            )
            out.update(score(start, end, batching.EncodedSplit(self._rows("dev")), spec.gold, **settings))
        return out

    def _batches(self, split: str, batch_size: int, order: np.ndarray | None = None, drop_last: bool = False):
        rows = self._rows(split)
        order = np.arange(len(rows["row"])) if order is None else order
        for index in global_batches(len(order), batch_size, self.rank, self.world_size, drop_last):
            picked = order[index]
            batch = batching.collate({k: rows[k][picked] for k in INPUTS}, self.spec.pad_to_multiple_of)
            for key in ("start_position", "end_position", *(("row",) if split == "dev" else ())):
                batch[key] = torch.as_tensor(rows[key][picked])
            yield batch


def score(
    start: np.ndarray,
    end: np.ndarray,
    encoded: batching.EncodedSplit,
    gold: qa_data.Gold,
    *,
    language: str,
    max_answer_length: int,
    allow_no_answer: bool,
) -> dict[str, float]:
    """exact_match and f1 of the answers decoded from every window's start and end logits."""
    contexts = [gold.contexts[c] for c in gold.context_of]
    answers = best_answers(start, end, encoded, contexts, max_answer_length, allow_no_answer)
    return qa_metrics.score_answers([a.text for a in answers], list(gold.answers), language)


def best_answers(
    start: np.ndarray,
    end: np.ndarray,
    encoded: batching.EncodedSplit,
    contexts: list[str],
    max_answer_length: int,
    allow_no_answer: bool = False,
    n_best: int = N_BEST,
) -> list[Answer]:
    """Each question's answer from its windows' start and end logits ([window, position]; positions past a
    window's width are never inside the context); an answer starts in the window where its first piece has the most
    context (`qa_data.best_windows`), as in the original BERT's SQuAD code."""
    arrays = encoded.arrays
    width = min(start.shape[1], arrays["piece_start"].shape[1])
    start, end = start[:, :width].astype(np.float64), end[:, :width].astype(np.float64)
    inside = arrays["piece_start"][:, :width] >= 0
    windows = np.arange(len(start))[:, None]
    k = min(n_best, width)
    s = np.where(inside & (arrays["max_context"][:, :width] > 0), start, -np.inf)
    e = np.where(inside, end, -np.inf)
    top_s = np.argsort(-s, axis=1, kind="stable")[:, :k]
    top_e = np.argsort(-e, axis=1, kind="stable")[:, :k]
    pairs = s[windows, top_s][:, :, None] + e[windows, top_e][:, None, :]
    span = top_e[:, None, :] - top_s[:, :, None]
    pairs = np.where((span >= 0) & (span < max_answer_length), pairs, -np.inf).reshape(len(start), -1)
    pick = pairs.argmax(1)
    best = pairs[np.arange(len(start)), pick]
    first, last = top_s[np.arange(len(start)), pick // k], top_e[np.arange(len(start)), pick % k]
    null = start[:, 0] + end[:, 0]

    out = []
    examples = arrays["example"]
    for q, context in enumerate(contexts):
        own = np.flatnonzero(examples == q)
        w = own[np.argmax(best[own])] if len(own) else -1
        if w < 0 or not np.isfinite(best[w]) or (allow_no_answer and null[own].min() > best[w]):
            out.append(Answer("", -1, -1, float(null[own].min()) if len(own) else 0.0))
            continue
        a, b = int(arrays["piece_start"][w, first[w]]), int(arrays["piece_end"][w, last[w]])
        out.append(Answer(context[a:b], a, b, float(best[w])))
    return out


@torch.no_grad()
def window_logits(
    model: torch.nn.Module,
    encoded: batching.EncodedSplit,
    batch_size: int = 64,
    pad_to_multiple_of: int = 8,
    precision: str = "fp32",
) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits of every window ([window, max_seq_length], 0 past its batch's width), from windows run
    in batches of similar length."""
    device = inference.eval_device(model)
    precision = amp.resolve_precision(precision, device)
    shape = encoded.arrays["input_ids"].shape
    start, end = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    order = batching.length_sorted_order(encoded.arrays["length"])
    for first in range(0, len(order), batch_size):
        index = order[first : first + batch_size]
        batch = batching.collate({k: encoded.arrays[k][index] for k in INPUTS}, pad_to_multiple_of)
        with amp.autocast(precision, device):
            out = model(**{k: v.to(device) for k, v in batch.items()})
        width = out.start_logits.shape[1]
        start[index, :width] = out.start_logits.float().cpu().numpy()
        end[index, :width] = out.end_logits.float().cpu().numpy()
    return start, end


def evaluate_questions(
    model, encoded: batching.EncodedSplit, gold: qa_data.Gold, decoding: dict[str, Any], **kwargs
) -> dict[str, float]:
    """exact_match and f1 of `model` on an encoded split (the published model's dev and test scores); `decoding`:
    `score`'s language, max_answer_length and allow_no_answer."""
    start, end = window_logits(model, encoded, **kwargs)
    return score(start, end, encoded, gold, **decoding)


def answer_questions(
    model,
    tokenizer,
    questions: list[str],
    contexts: list[str],
    max_seq_length: int,
    doc_stride: int,
    max_question_length: int = 64,
    max_answer_length: int = 30,
    allow_no_answer: bool = False,
    **kwargs,
) -> list[Answer]:
    """Each question's answer in its context, with its character offsets, read through windows."""
    ids = [str(i) for i in range(len(questions))]
    split = qa_data.QuestionSplit("questions", ids, questions, contexts, [[] for _ in questions])
    encoded = qa_data.encode_questions(split, tokenizer, max_seq_length, doc_stride, max_question_length)
    start, end = window_logits(model, encoded, **kwargs)
    return best_answers(start, end, encoded, contexts, max_answer_length, allow_no_answer)
