"""The README's English path on CPUs with the shipped configs: prepare_en.yaml (a 3,000-piece SentencePiece
tokenizer trained on the corpus, 64-token SOP instances, Ray Data) → pretrain_en.yaml at its own model shape (Ray
Train) → a model directory that transformers loads with AutoTokenizer and gives the same ids and logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from export_helpers import assert_transformers_reads_export

from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.demo.corpus import write_stdlib_corpus
from albert_dist.pretrain.config import PretrainJobConfig

pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parents[1] / "albert_dist" / "configs"
TEXT, PAIR = "Return the number of items in a container.", "Raise ValueError when the argument is not valid."


def test_prepare_en_and_pretrain_en_run_together_and_export_for_transformers(tmp_path, ray_session):
    from albert_dist.data.loading import load_prepared, prepared_location
    from albert_dist.data.prepare import prepare_dataset
    from albert_dist.pretrain.job import PRETRAIN

    corpus = write_stdlib_corpus(tmp_path / "corpus.txt", 400_000)
    data_cfg = load_config(
        DataJobConfig, CONFIGS / "prepare_en.yaml", [f"run.output_dir={tmp_path}", f"data.inputs=[{corpus}]"]
    )
    summary = prepare_dataset(data_cfg, log=lambda _: None)
    assert summary["instances"] > 0
    cfg = load_config(
        PretrainJobConfig,
        CONFIGS / "pretrain_en.yaml",
        [
            f"run.output_dir={tmp_path}",
            "scaling.num_workers=1",
            "train.precision=fp32",
            "train.max_steps=4",
            "train.warmup_steps=1",
            "train.eval_every=4",
            "train.eval_batches=2",
            "train.checkpoint_every=4",
        ],
    )
    outcome = PRETRAIN.run(cfg)
    assert outcome.metrics["step"] == 4 and np.isfinite(outcome.metrics["eval_mlm_accuracy"])

    tokenizer = load_prepared(prepared_location(cfg)).tokenizer
    _, hf_model = assert_transformers_reads_export(outcome.model_dir, tokenizer, TEXT, PAIR)
    assert (hf_model.config.vocab_size, hf_model.config.hidden_size) == (3000, 128)
