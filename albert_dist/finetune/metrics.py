"""GLUE-style metrics in numpy: accuracy, macro-F1 and MCC from a confusion matrix; Pearson and Spearman.

Classification metrics are computed from the confusion matrix because it is additive: the training loop sums it
over batches and ranks like any other statistic.
"""

from __future__ import annotations

import numpy as np


def confusion_matrix(predictions: np.ndarray, labels: np.ndarray, num_labels: int) -> np.ndarray:
    """[true, predicted] counts."""
    flat = np.asarray(labels, dtype=np.int64) * num_labels + np.asarray(predictions, dtype=np.int64)
    return np.bincount(flat, minlength=num_labels * num_labels).reshape(num_labels, num_labels)


def classification_metrics(confusion: np.ndarray) -> dict[str, float]:
    """accuracy; macro-F1 averaged over all classes (a class never true nor predicted scores 0); multiclass MCC
    (Gorodkin's R_K, the binary MCC for two classes), 0 when undefined."""
    c = np.asarray(confusion, dtype=np.float64)
    total, correct = c.sum(), np.trace(c)
    true, predicted = c.sum(axis=1), c.sum(axis=0)
    tp = np.diag(c)
    f1_denominator = true + predicted
    f1 = np.divide(2 * tp, f1_denominator, out=np.zeros_like(tp), where=f1_denominator > 0)
    mcc_denominator = np.sqrt((total**2 - (predicted**2).sum()) * (total**2 - (true**2).sum()))
    mcc = (correct * total - (predicted * true).sum()) / mcc_denominator if mcc_denominator > 0 else 0.0
    return {"accuracy": float(correct / total) if total else 0.0, "f1": float(f1.mean()), "mcc": float(mcc)}


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (as scipy.stats.rankdata)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.r_[True, sorted_values[1:] != sorted_values[:-1]]
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(values)] - 1
    ranks = np.empty(len(values))
    ranks[order] = (first[group] + last[group]) / 2 + 1
    return ranks


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r; 0 when either side is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return float((dx * dy).sum() / denominator) if denominator > 0 else 0.0


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(average_ranks(x), average_ranks(y))


def regression_metrics(predictions: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    return {"pearson": pearson(predictions, targets), "spearman": spearman(predictions, targets)}


def task_metrics(task: str, logits: np.ndarray, labels: np.ndarray, num_labels: int) -> dict[str, float]:
    """The metrics of `task` ("classification" or "regression") from model outputs and gold labels."""
    if task == "regression":
        return regression_metrics(np.asarray(logits).reshape(-1), labels)
    return classification_metrics(confusion_matrix(np.asarray(logits).argmax(-1), labels, num_labels))
