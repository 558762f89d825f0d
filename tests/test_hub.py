"""The Hugging Face Hub in and out: hub ids resolve offline from a pre-populated huggingface_hub cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from chinese_helpers import ZH_SENTENCES
from hub_helpers import COMMIT, REPO, hub_cache

from albert_dist.config import load_config
from albert_dist.data.config import DataJobConfig
from albert_dist.finetune.config import DistillJobConfig, FinetuneJobConfig
from albert_dist.hub.download import hub_id
from albert_dist.tokenizer.albert_tokenizer import AlbertTokenizer

ROOT = Path(__file__).resolve().parent.parent

# a fresh interpreter, so that huggingface_hub reads HF_HUB_OFFLINE and HF_HUB_CACHE as a user's shell sets them
OFFLINE_LOADS = """
import json, sys
import torch
from albert_dist.errors import CheckpointError
from albert_dist.model import AlbertForPreTraining, AlbertForSequenceClassification
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
repo, commit, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ids = torch.tensor([[2, 30, 31, 32, 3]])
out = {}
model = AlbertForPreTraining.from_pretrained(repo)
out["mlm"] = model(ids).prediction_logits.tolist()
out["pinned_mlm"] = AlbertForPreTraining.from_pretrained(f"{repo}@{commit}")(ids).prediction_logits.tolist()
classifier = AlbertForSequenceClassification.from_pretrained(repo, num_labels=3)
out["classifier_labels"] = classifier.config.num_labels
out["ids"] = [load_tokenizer(repo).encode(t) for t in texts]
for bad in ("nobody-here/no-such-model", f"{repo}@no-such-branch"):
    try:
        AlbertForPreTraining.from_pretrained(bad)
        out[bad] = "loaded"
    except CheckpointError as err:
        out[bad] = str(err)
print(json.dumps(out))
"""


def offline_env(tmp_path: Path) -> dict[str, str]:
    return os.environ | {
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PYTHONPATH": str(ROOT),
    }


def test_hub_ids_load_models_and_tokenizers_offline_from_the_cache(tmp_path):
    model = hub_cache(tmp_path / "hub")
    texts = ZH_SENTENCES[:4] + ["Deep learning用Ray Data处理，ALBERT!"]
    run = subprocess.run(
        [sys.executable, "-c", OFFLINE_LOADS, REPO, COMMIT, json.dumps(texts)],
        env=offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    expected = model(torch.tensor([[2, 30, 31, 32, 3]])).prediction_logits
    torch.testing.assert_close(torch.tensor(out["mlm"]), expected)
    torch.testing.assert_close(torch.tensor(out["pinned_mlm"]), expected)
    assert out["classifier_labels"] == 3
    snapshot = tmp_path / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    assert out["ids"] == [AlbertTokenizer(snapshot).encode(t) for t in texts]
    assert all(1 not in ids for ids in out["ids"])  # no [UNK]: the comparison covers real pieces
    # the pickle was converted once, into albert-dist's cache; the hub's cache is left as the hub wrote it
    assert len(list((tmp_path / "cache" / "albert-dist" / "safetensors").iterdir())) == 1
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "pytorch_model.bin", "vocab.txt"]
    missing = out["nobody-here/no-such-model"]
    assert missing.startswith("nobody-here/no-such-model is neither a local directory nor a model")
    assert "offline" in missing and "\n" not in missing
    assert out[f"{REPO}@no-such-branch"].startswith(f"{REPO}@no-such-branch is neither")


def test_a_local_directory_wins_over_a_hub_id_of_the_same_form(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub_id(REPO) == (REPO, None)
    assert hub_id(f"{REPO}@v1.0") == (REPO, "v1.0")
    (tmp_path / REPO).mkdir(parents=True)
    assert hub_id(REPO) is None
    for not_an_id in ("/abs/model", "./rel/model", "a/b/c", "s3://bucket/model", "model"):
        assert hub_id(not_an_id) is None


def test_configs_take_a_hub_id():
    pinned = f"{REPO}@{COMMIT}"
    cfg = load_config(FinetuneJobConfig, None, [f"model.init_from={pinned}", "finetune.epochs=1"])
    assert cfg.model.init_from == pinned
    prepare = load_config(DataJobConfig, None, [f"tokenizer.path={pinned}", "tokenizer.kind=wordpiece"])
    assert prepare.tokenizer.path == pinned
    distill = load_config(DistillJobConfig, None, [f"student.init_from={REPO}", "finetune.epochs=1"])
    assert distill.student.init_from == REPO
