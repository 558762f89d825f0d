"""One text normalization, the tokenizer's own: raw Chinese and English text (full-width punctuation and digits,
emoji, control characters, accents) gives the same ids through `data prepare`, fine-tuning, `predict` and the MLflow
pyfunc models as through transformers' AutoTokenizer on the export; a vocabulary prepared from Chinese text knows
every character its corpus uses five times or more."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from chinese_helpers import ZH_SENTENCES

from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

CONFIGS = Path(__file__).resolve().parents[1] / "albert_dist" / "configs"
MAX_LENGTH = 512

RAW_LINES = [
    "质量很好，物流也快！推荐（５星）",
    "价格是３．１４元，约合０.５美元。下一句：１２３４５６７８９０。",
    "他问：“你去哪儿？”我说：“回家！”",
    "这是第一句……这是第二句。《红楼梦》是名著；《西游记》也是。",
    "表情😀很可爱👍🏽，还有❤️和🇨🇳！",
    "控制字符\x07在这里\x1b被删掉\u200b了\x00。",
    "全角空格　和\t制表符，还有\r回车、顿号・中点﹐小逗号。",
    "Ｆｕｌｌ－ｗｉｄｔｈ ＡＢＣ　１２３ letters！",
    "Crème brûlée à la façon de Zoë, naïve café résumé.",
    "İstanbul ǅ Straße ﬁne ÅNGSTRÖM ½ ² ™.",
    "Mixed 中文 and English: ALBERT模型（v2）效果更好！",
    "Vertical\x0btab, form\x0cfeed, separator\x1cx and NEL\x85 here, line\u2028sep.",
    "日本語のテキスト、カタカナ。ｶﾀｶﾅ半角も。",
    "Return a new list. Raise ValueError if x < 0 (see PEP 8) — done…",
    *ZH_SENTENCES,
]


def _documents(n: int, seed: int = 0) -> list[str]:
    """Documents of 2-3 raw lines each, every line used many times."""
    rng = random.Random(seed)
    return ["\n".join(rng.sample(RAW_LINES, rng.randint(2, 3))) for _ in range(n)]


DOCUMENTS = _documents(240)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, ray_session):
    """The README's Chinese path, `data prepare` with prepare_zh.yaml (a WordPiece vocabulary built from the corpus,
    jieba whole words), on the documents as JSONL; one instance per document (no eval split, no short targets)."""
    from albert_dist.data.loading import load_prepared
    from albert_dist.data.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("normalization")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCUMENTS), encoding="utf-8")
    cfg = load_config(
        DataJobConfig,
        CONFIGS / "prepare_zh.yaml",
        [
            f"run.output_dir={root}",
            f"data.inputs=[{corpus}]",
            f"data.max_seq_length={MAX_LENGTH}",
            "data.eval_fraction=0",
            "data.short_seq_prob=0",
            "tokenizer.vocab_size=600",
            "data.tokenizer_actors=1",
        ],
    )
    prepare_dataset(cfg, log=lambda _: None)
    return load_prepared(root / cfg.data.output), root / cfg.data.output / "tokenizer"


@pytest.fixture(scope="module")
def exports(prepared, tmp_path_factory):
    """A classifier and a pretrained model directory as albert-dist exports them, with the prepared tokenizer."""
    from albert_dist.finetune import inference
    from albert_dist.model import AlbertConfig, AlbertForPreTraining, AlbertForSequenceClassification

    data, tokenizer_dir = prepared
    tokenizer = load_tokenizer(tokenizer_dir)
    config = dict(
        vocab_size=tokenizer.vocab_size,
        embedding_size=8,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=MAX_LENGTH,
    )
    out = {}
    for name, model in (
        ("classifier", AlbertForSequenceClassification(AlbertConfig(**config, num_labels=2))),
        ("encoder", AlbertForPreTraining(AlbertConfig(**config))),
    ):
        directory = tmp_path_factory.mktemp(name)
        model.save_pretrained(directory)
        tokenizer.save(directory)
        inference.save_reading(directory, MAX_LENGTH)
        out[name] = directory
    return out


def _autotokenizer_ids(directory: Path, texts: list[str]) -> list[list[int]]:
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(directory)
    return [hf(text, add_special_tokens=False)["input_ids"] for text in texts]


def _instance_ids(data) -> list[list[int]]:
    """Each instance's A and B tokens in the document's order (B first when SOP swapped them)."""
    rows = data.train.take_batch(len(DOCUMENTS) + 1, batch_format="numpy")
    out = []
    for ids, types, label in zip(rows["input_ids"], rows["token_type_ids"], rows["sop_label"]):
        ids, types = np.asarray(ids), np.asarray(types)
        a, b = ids[1:][types[1:] == 0][:-1], ids[types == 1][:-1]
        out.append((np.concatenate([b, a]) if label else np.concatenate([a, b])).tolist())
    return out


def _seen_by_model(module: torch.nn.Module) -> list[list[int]]:
    """A forward pre-hook's record of the unpadded input ids of every row the module is given."""
    seen: list[list[int]] = []

    def record(_, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        seen.extend(row[m.bool()].tolist() for row, m in zip(ids, mask))

    module.register_forward_pre_hook(record, with_kwargs=True)
    return seen


def _strip_specials(rows: list[list[int]], cls_id: int, sep_id: int) -> list[list[int]]:
    assert all(r[0] == cls_id and r[-1] == sep_id for r in rows)
    return [r[1:-1] for r in rows]


@pytest.mark.slow  # data prepare runs on Ray
def test_every_path_gives_the_exported_tokenizers_ids(prepared, exports, tmp_path):
    from albert_dist.finetune.config import TaskDataSection
    from albert_dist.finetune.job import prepare_task_data
    from albert_dist.finetune.mlflow_model import SequenceClassifierModel
    from albert_dist.pretrain.mlflow_model import EncoderModel
    from albert_dist.tracking.models import MODEL_ARTIFACT

    data, _ = prepared
    reference = _autotokenizer_ids(exports["classifier"], DOCUMENTS)
    assert reference == _autotokenizer_ids(exports["encoder"], DOCUMENTS)
    cls_id, sep_id = data.tokenizer.cls_id, data.tokenizer.sep_id

    # data prepare: one instance per document, in document order
    assert _instance_ids(data) == reference

    # fine-tuning (and distillation, which reads its data the same way)
    rows = [{"text": d, "label": str(i % 2)} for i, d in enumerate(DOCUMENTS)]
    for split in ("train", "dev"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    section = TaskDataSection(
        train=str(tmp_path / "train.jsonl"), dev=str(tmp_path / "dev.jsonl"), max_seq_length=MAX_LENGTH
    )
    arrays = prepare_task_data(section, "classification", exports["classifier"]).splits["train"].arrays
    finetuned = [ids[:n].tolist() for ids, n in zip(arrays["input_ids"], arrays["length"])]
    assert _strip_specials(finetuned, cls_id, sep_id) == reference

    # predict and the classifier's pyfunc model (which predicts through predict's Predictor)
    frame = pd.DataFrame({"text": DOCUMENTS})
    classifier = SequenceClassifierModel()
    classifier.load_context(SimpleNamespace(artifacts={MODEL_ARTIFACT: str(exports["classifier"])}))
    seen = _seen_by_model(classifier.predictor.model.albert)
    assert len(classifier.predict(None, frame)) == len(DOCUMENTS)
    assert sorted(_strip_specials(seen, cls_id, sep_id)) == sorted(reference)

    # the pretrained encoder's pyfunc model
    encoder = EncoderModel()
    encoder.load_context(SimpleNamespace(artifacts={MODEL_ARTIFACT: str(exports["encoder"])}))
    seen = _seen_by_model(encoder.model.albert)
    assert len(encoder.predict(None, frame)) == len(DOCUMENTS)
    assert sorted(_strip_specials(seen, cls_id, sep_id)) == sorted(reference)


@pytest.mark.slow
def test_prepared_chinese_vocabulary_knows_every_frequent_character(prepared):
    data, tokenizer_dir = prepared
    vocab = set((tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").split("\n"))
    assert {"，", "。", "！", "？", "（", "）", "５", "：", "；", "“", "”", "…"} <= vocab  # as bert-base-chinese's
    counts = Counter("".join(DOCUMENTS))
    frequent = sorted(c for c, n in counts.items() if n >= 5)
    assert len(frequent) > 200
    unknown = [c for c in frequent if data.tokenizer.unk_id in data.tokenizer.encode(c)]
    assert not unknown, f"[UNK] for {unknown}"
    tokens = sum(len(ids) for ids in _instance_ids(data))
    unk = sum(ids.count(data.tokenizer.unk_id) for ids in _instance_ids(data))
    assert tokens > 5000 and unk == 0


def test_data_prepared_through_nfkc_is_refused(tmp_path):
    """Format 1 instances were tokenized after NFKC, with a vocabulary that lacks full-width characters: a model
    pretrained on them reads raw text with [UNK]s, so they are prepared again rather than trained on."""
    from albert_dist.data.loading import load_prepared
    from albert_dist.errors import DataError

    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1}), encoding="utf-8")
    with pytest.raises(DataError, match="dataset format 1, this version reads 2: prepare it again"):
        load_prepared(tmp_path)
