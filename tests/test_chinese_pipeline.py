"""The Chinese path end to end with the shipped configs: prepare_zh.yaml (a BERT-Chinese vocab.txt built from the
corpus, jieba whole-word masking in the Ray Data actors) → pretrain_zh.yaml (Ray Train) → a model directory that
transformers loads with AutoTokenizer and gives the same ids and logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from chinese_helpers import ZH_SENTENCES, zh_corpus
from export_helpers import assert_transformers_reads_export

from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.errors import ConfigError, DataError
from albert_dist.pretrain.config import PretrainJobConfig

pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parents[1] / "albert_dist" / "configs"


def prepare_config(root: Path, corpus: Path, *extra: str) -> DataJobConfig:
    return load_config(
        DataJobConfig,
        CONFIGS / "prepare_zh.yaml",
        [
            f"run.output_dir={root}",
            f"data.inputs=[{corpus}]",
            "data.max_seq_length=64",
            "tokenizer.vocab_size=500",
            "data.eval_fraction=0.1",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, ray_session):
    from albert_dist.data.loading import load_prepared
    from albert_dist.data.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("zh-pipeline")
    cfg = prepare_config(root, zh_corpus(root / "zh.txt"))
    summary = prepare_dataset(cfg, log=lambda _: None)
    return root, cfg, summary, load_prepared(root / cfg.data.output)


def test_prepare_builds_a_bert_chinese_vocab_and_jieba_word_starts(prepared):
    import transformers

    root, cfg, summary, data = prepared
    m = data.manifest
    assert m["tokenizer"]["file"] == "vocab.txt" and m["config"]["data"]["word_segmenter"] == "jieba"
    tok_dir = root / cfg.data.output / "tokenizer"
    vocab = (tok_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert {c for c in "".join(ZH_SENTENCES) if "\u4e00" <= c <= "\u9fff"} <= set(vocab)  # each CJK char a token
    assert not [t for t in vocab if t.startswith("##") and len(t) == 3 and "\u4e00" <= t[2] <= "\u9fff"]
    hf = transformers.AutoTokenizer.from_pretrained(tok_dir)
    assert [hf.encode(s, add_special_tokens=False) for s in ZH_SENTENCES] == [
        data.tokenizer.encode(s) for s in ZH_SENTENCES
    ]
    rows = data.train.take_batch(200, batch_format="numpy")
    tokens = [data.tokenizer.convert_ids_to_tokens(ids) for ids in rows["input_ids"]]
    cjk = [(t, s) for ts, ss in zip(tokens, rows["word_start"]) for t, s in zip(ts, ss) if "\u4e00" <= t[0] <= "\u9fff"]
    continuation = sum(not s for _, s in cjk) / len(cjk)
    assert 0.2 < continuation < 0.7  # jieba words of 2+ characters; character-level masking would give 0
    assert summary.get("segmentation_fallbacks", 0) == 0


def test_user_dict_is_read_and_checked(prepared, tmp_path):
    root, _, _, _ = prepared
    with pytest.raises(DataError, match="cannot read data.user_dict"):
        from albert_dist.data.prepare import prepare_dataset

        prepare_dataset(prepare_config(tmp_path, root / "zh.txt", f"data.user_dict={tmp_path / 'missing.txt'}"))
    with pytest.raises(ConfigError, match="user_dict needs word_segmenter"):
        prepare_config(tmp_path, root / "zh.txt", "data.user_dict=x.txt", "data.word_segmenter=")
    with pytest.raises(ConfigError, match="apply to kind=sentencepiece only"):
        prepare_config(tmp_path, root / "zh.txt", "tokenizer.model_type=bpe")


def test_pretrain_zh_runs_and_exports_for_transformers(prepared, ray_session):
    from albert_dist.pretrain.job import PRETRAIN

    root, cfg, _, data = prepared
    pretrain_cfg = load_config(
        PretrainJobConfig,
        CONFIGS / "pretrain_zh.yaml",
        [
            f"run.output_dir={root}",
            "model.embedding_size=32",
            "model.hidden_size=64",
            "model.num_hidden_layers=2",
            "model.num_attention_heads=2",
            "model.intermediate_size=128",
            "scaling.num_workers=1",
            "train.precision=fp32",
            "train.max_steps=4",
            "train.warmup_steps=1",
            "train.batch_size=8",
            "train.eval_every=4",
            "train.eval_batches=2",
            "train.checkpoint_every=4",
            "train.log_every=2",
        ],
    )
    assert pretrain_cfg.data.output == cfg.data.output  # the pretraining config reads what prepare_zh.yaml writes
    outcome = PRETRAIN.run(pretrain_cfg)
    assert outcome.metrics["step"] == 4 and np.isfinite(outcome.metrics["eval_mlm_accuracy"])

    hf_tok, _ = assert_transformers_reads_export(outcome.model_dir, data.tokenizer, ZH_SENTENCES[3], ZH_SENTENCES[8])
    assert type(hf_tok).__name__.startswith("BertTokenizer")
