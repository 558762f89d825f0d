"""A tiny Chinese ALBERT as the Hugging Face Hub serves the albert_chinese_* models (config.json, pytorch_model.bin,
vocab.txt), laid out in huggingface_hub's own cache (models--org--name/refs/main, snapshots/<commit>/...) so that
hub ids resolve offline."""

from __future__ import annotations

from pathlib import Path

import torch
from chinese_helpers import ZH_SENTENCES

from albert_dist.model import AlbertConfig, AlbertForPreTraining

REPO = "tiny-org/albert_chinese_tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def zh_vocab() -> list[str]:
    """BERT's specials, every character of the test sentences, and Latin word pieces for the mixed text."""
    chars = sorted({c for s in ZH_SENTENCES for c in s if not c.isascii() and not c.isspace()})
    latin = ["deep", "learning", "ray", "data", "al", "##bert", "be", "##rt", "model", "1", "2", ",", ".", "!"]
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *latin, *chars]


def tiny_model(vocab_size: int) -> AlbertForPreTraining:
    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=vocab_size,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        architectures=["AlbertForPreTraining"],
    )
    return AlbertForPreTraining(config).eval()


def hub_cache(root: Path, repo: str = REPO, commit: str = COMMIT) -> AlbertForPreTraining:
    """`repo` at `commit` (also its main branch) in the cache at `root` ($HF_HUB_CACHE); returns the model it holds."""
    vocab = zh_vocab()
    model = tiny_model(len(vocab))
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    model.config.to_json_file(snapshot / "config.json")
    state = model.state_dict()
    state["predictions.decoder.weight"] = state["albert.embeddings.word_embeddings.weight"]  # tied, as they ship
    torch.save(state, snapshot / "pytorch_model.bin")
    (snapshot / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    return model
