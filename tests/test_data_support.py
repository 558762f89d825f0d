"""Fixtures shared by the data tests: real SentencePiece models trained on real (or generated) text."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from albert_dist.data.instances import InstanceSpec
from albert_dist.data.process import DocumentProcessor, ProcessSettings

_CJK_POOL = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处理"
_ENDINGS = ["。", "！", "？", "；", "。」", "！”"]


def chinese_documents(n_docs: int, seed: int = 0) -> list[str]:
    """Seeded random Chinese-looking documents: sentences of pool characters with CJK terminators and quotes."""
    rng = np.random.default_rng(seed)
    pool = np.array(list(_CJK_POOL))
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(int(rng.integers(2, 12))):
            body = "".join(pool[rng.zipf(1.3, int(rng.integers(5, 30))) % len(pool)])
            ending = _ENDINGS[int(rng.integers(len(_ENDINGS)))]
            sentences.append(("「" if ending.endswith("」") else "“" if ending.endswith("”") else "") + body + ending)
        docs.append("".join(sentences))
    return docs


@pytest.fixture(scope="session")
def english_tokenizer(stdlib_corpus, tmp_path_factory):
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
    from albert_dist.tokenizer.training import train_sentencepiece

    out = tmp_path_factory.mktemp("spm-en")
    train_sentencepiece([stdlib_corpus], out, 2000, progress=lambda _: None)
    return load_tokenizer(out)


@pytest.fixture(scope="session")
def chinese_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus-zh") / "zh.txt"
    path.write_text("\n\n".join(chinese_documents(1500)) + "\n", encoding="utf-8")
    return path


def instance_batch(tokenizer, texts: list[str], max_seq_length: int = 128, **masking) -> dict[str, np.ndarray]:
    """Instances of `texts` (one document each) as Ray Data's numpy batches hold them, built without Ray."""
    spec = InstanceSpec(max_seq_length, 0.1, tokenizer.cls_id, tokenizer.sep_id)
    process = DocumentProcessor(tokenizer, ProcessSettings(spec=spec), **masking)
    table = process(
        {
            "doc_key": np.array([f"d{i}" for i in range(len(texts))], object),
            "text": np.array(texts, object),
            "presplit": np.zeros(len(texts), bool),
        }
    )
    return {name: _numpy_column(table.column(name)) for name in table.column_names}


def _numpy_column(column: pa.ChunkedArray) -> np.ndarray:
    """A list column as Ray Data's numpy batches hold it: an object array of per-row arrays."""
    array = column.combine_chunks()
    if not pa.types.is_list(array.type):
        return array.to_numpy(zero_copy_only=False)
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    out = np.empty(len(array), object)
    for i, row in enumerate(np.split(values, offsets[1:-1] - offsets[0])):
        out[i] = row  # element-wise: equal-length rows must not become one 2-D block
    return out
