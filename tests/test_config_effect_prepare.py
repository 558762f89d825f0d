"""Every key of data preparation has an effect: set to another valid value, it changes what `data prepare` writes
as pretraining reads it (the shards' bytes, the tokenizer, the counts, the held-out masks' settings, where) or how
it ran (ranges, tokenizer actors). Each key costs a real preparation through Ray Data (~5 s on 2 cores).
"""

from __future__ import annotations

from typing import Any

import pytest
from effect_helpers import keys_without_effect, leaf_keys

from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig

pytestmark = pytest.mark.slow


class Preparation:
    """`data prepare` run for real, resolved into what it wrote as pretraining reads it (the shards' bytes, the
    tokenizer, the counts, the held-out masks' settings, where) and how it ran (ranges, tokenizer actors)."""

    def __init__(self, cfg: DataJobConfig):
        self.cfg = cfg

    def resolved(self) -> dict[str, Any]:
        from albert_dist.data.loading import load_prepared, prepared_location
        from albert_dist.data.masking import MaskingCollator
        from albert_dist.data.prepare import TIMINGS, prepare_dataset

        summary = prepare_dataset(self.cfg, log=lambda _: None)
        location = prepared_location(self.cfg)
        manifest = load_prepared(location).manifest
        masks = vars(MaskingCollator.from_manifest(manifest))
        return {
            "location": location,
            "splits": manifest["splits"],
            "tokenizer": manifest["tokenizer"],
            "summary": {k: v for k, v in summary.items() if k not in TIMINGS},
            "heldout_masks": {k: v.tolist() if hasattr(v, "tolist") else v for k, v in masks.items()},
        }


@pytest.fixture(scope="module")
def mixed_corpus(tmp_path_factory, stdlib_corpus):
    """JSONL documents in English and Chinese, each with a second text field; another such file; a jieba user
    dictionary that joins words the corpus has; a SentencePiece tokenizer trained on the corpus."""
    import json

    from chinese_helpers import zh_corpus

    from albert_dist.tokenizer.training import train_sentencepiece

    root = tmp_path_factory.mktemp("prepare-effect")
    english = [d for d in stdlib_corpus.read_text().split("\n\n") if len(d) > 200][:120]
    chinese = zh_corpus(root / "zh.txt", documents=120).read_text(encoding="utf-8").split("\n\n")
    documents = [d.strip() for pair in zip(english, chinese) for d in pair]
    for name, docs in (("corpus.jsonl", documents), ("other.jsonl", documents[::-1][:150])):
        lines = [json.dumps({"text": d, "body": d[::-1]}, ensure_ascii=False) for d in docs]
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "words.txt").write_text("北京大学学习 100000\n自然语言处理是 100000\n", encoding="utf-8")
    (root / "plain.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    train_sentencepiece([root / "plain.txt"], root / "tokenizer", 700, progress=lambda _: None)
    train_sentencepiece([root / "plain.txt"], root / "other_tokenizer", 500, progress=lambda _: None)
    return root


TOKENIZER_TRAINING = (
    "tokenizer.kind",
    "tokenizer.vocab_size",
    "tokenizer.character_coverage",
    "tokenizer.input_sentence_size",
    "tokenizer.model_type",
)


def test_every_data_preparation_key_changes_what_it_writes(mixed_corpus, ray_session):
    """Two bases, as the config allows them: a given tokenizer and static masks (the masking keys are refused
    without them) for every key but the tokenizer's training options, which are refused with a given tokenizer
    and are tried on a base that trains one."""
    root = mixed_corpus
    common = [
        f"run.output_dir={root}",
        f"data.inputs=[{root / 'corpus.jsonl'}]",
        "data.output=prepared",
        "data.max_seq_length=64",
        "data.eval_fraction=0.1",
        "data.word_segmenter=jieba",
    ]
    given = load_config(DataJobConfig, None, [*common, f"tokenizer.path={root / 'tokenizer'}", "masking.static=true"])
    alternatives = {
        "run.output_dir": str(root / "elsewhere"),
        "data.output": "prepared_other",
        "data.inputs": [str(root / "other.jsonl")],
        "data.text_field": "body",
        "data.max_sentence_chars": 30,
        "data.rows_per_shard": 50,
        "data.tokenizer_actors": 2,
        "data.range_bytes": 30_000,
        "data.word_segmenter": None,
        "data.user_dict": str(root / "words.txt"),
        "tokenizer.path": str(root / "other_tokenizer"),
    }
    trained_elsewhere = dict.fromkeys(TOKENIZER_TRAINING, "tried on the base that trains a tokenizer, below")
    assert keys_without_effect(Preparation, given, alternatives, trained_elsewhere) == []

    trains = load_config(DataJobConfig, None, [*common, "tokenizer.vocab_size=300"])
    only_training = {key: "tried above" for key, _ in leaf_keys(DataJobConfig) if key not in TOKENIZER_TRAINING}
    alternatives = {"tokenizer.input_sentence_size": 300, "tokenizer.character_coverage": 0.98}
    assert keys_without_effect(Preparation, trains, alternatives, only_training) == []
