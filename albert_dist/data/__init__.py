"""Pretraining data: corpus → sentences → SOP instances in Parquet shards, and masking at training time."""

from albert_dist.data.loading import PreparedData, load_prepared
from albert_dist.data.masking import IGNORE_INDEX, MaskingCollator, batch_rng
from albert_dist.data.prepare import prepare_dataset, run_prepare
from albert_dist.data.sentences import detect_language, split_sentences

__all__ = [
    "IGNORE_INDEX",
    "MaskingCollator",
    "PreparedData",
    "batch_rng",
    "detect_language",
    "load_prepared",
    "prepare_dataset",
    "run_prepare",
    "split_sentences",
]
