"""The Hugging Face Hub in and out: hub ids resolve offline from a pre-populated huggingface_hub cache."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from chinese_helpers import ZH_SENTENCES
from hub_helpers import COMMIT, REPO, HubStandIn, cached_snapshot, hub_cache, tiny_model, zh_vocab

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


def run_offline(tmp_path, script: str, *args: str) -> dict:
    """`script` run by a fresh interpreter with the hub offline and its cache under `tmp_path`: its JSON output."""
    run = subprocess.run(
        [sys.executable, "-c", script, *args], env=offline_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_hub_ids_load_models_and_tokenizers_offline_from_the_cache(tmp_path):
    model = hub_cache(tmp_path / "hub")
    texts = ZH_SENTENCES[:4] + ["Deep learning用Ray Data处理，ALBERT!"]
    out = run_offline(tmp_path, OFFLINE_LOADS, REPO, COMMIT, json.dumps(texts))
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


MIXED = ["Deep learning用Ray Data处理，ALBERT模型!", "这个开源项目使用Ray Data并行处理大规模语料库。"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny Chinese classifier with its card, and its `albert-dist export`."""
    from albert_dist.export.run import run_export
    from albert_dist.hub import card
    from albert_dist.model import AlbertForSequenceClassification

    root = tmp_path_factory.mktemp("hub-out")
    vocab = zh_vocab()
    (root / "vocab").mkdir()
    (root / "vocab" / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    model_dir = root / "model"
    config = dataclasses.replace(tiny_model(len(vocab)).config, num_labels=2)
    AlbertForSequenceClassification(config).save_pretrained(model_dir)
    AlbertTokenizer(root / "vocab").save(model_dir)
    source_facts = card.CardFacts(
        title="lcqmc (finetune)",
        task="finetune",
        architecture="AlbertForSequenceClassification",
        languages=["zh"],
        model_config=json.loads((model_dir / "config.json").read_text()),
        data={"data.train": "s3://bucket/lcqmc/train.tsv", "digest (sha256)": "ab" * 32},
        metrics={"dev_accuracy": 0.75},
        mlflow={"run_id": "f" * 32, "tracking_uri": "https://user:pw@mlflow.example.com", "experiment": "zh"},
        base_model=REPO,
    )
    (model_dir / card.CARD_NAME).write_text(card.render(source_facts), encoding="utf-8")
    older = root / "older"  # a model published without tokenizer.json: its export writes one
    shutil.copytree(model_dir, older)
    (older / "tokenizer.json").unlink()
    run_export(older, root / "export")
    return root


def test_exports_carry_a_fast_tokenizer_that_transformers_loads_with_our_ids(exported, tmp_path):
    import transformers

    ours = AlbertTokenizer(exported / "model")
    for directory in (exported / "model", exported / "export"):
        alone = tmp_path / directory.name
        shutil.copytree(directory, alone)
        (alone / "vocab.txt").unlink()  # what transformers reads is tokenizer.json, the whole pipeline
        hf = transformers.AutoTokenizer.from_pretrained(alone)
        assert hf.is_fast and hf.backend_tokenizer is not None
        for text in [*ZH_SENTENCES, *MIXED]:
            assert hf(text)["input_ids"] == [ours.cls_id, *ours.encode(text), ours.sep_id]
        pair = hf(MIXED[0], ZH_SENTENCES[2])
        assert pair["input_ids"] == ours.encode_pair(MIXED[0], ZH_SENTENCES[2])["input_ids"]
        assert pair["token_type_ids"] == ours.encode_pair(MIXED[0], ZH_SENTENCES[2])["token_type_ids"]
        assert 1 not in pair["input_ids"]  # no [UNK]: every piece was compared


def test_the_export_card_says_what_was_exported_and_carries_the_source_card(exported):
    from huggingface_hub import ModelCard

    card = ModelCard.load(exported / "export" / "README.md")
    assert card.data.pipeline_tag == "text-classification" and card.data.language == ["zh"]
    assert {"albert", "albert-dist", "export", "onnx", "fp32"} <= set(card.data.tags)
    assert card.data.library_name == "transformers"
    text = card.text
    assert "ONNX opset" in text and "max abs diff" in text  # the check against PyTorch
    # the source model's card: data source and digest, metrics, MLflow run (the URL's password never written)
    assert "s3://bucket/lcqmc/train.tsv" in text and "ab" * 32 in text and "dev_accuracy | 0.75" in text
    assert "f" * 32 in text and "mlflow.example.com" in text and "pw@" not in text
    assert f"base model: `{REPO}`" in text
    source = ModelCard.load(exported / "model" / "README.md")
    assert source.data.base_model == REPO and source.data.pipeline_tag == "text-classification"
    assert "AutoTokenizer.from_pretrained" in source.text and "albert-dist predict --model" in source.text


OFFLINE_PREDICTS = """
import json, sys
import numpy as np
from albert_dist.finetune.predict import Predictor
texts = json.loads(sys.argv[1])
out = {}
for repo, backend in (("me/lcqmc", "torch"), ("me/lcqmc-onnx", "onnx")):
    rows = Predictor(repo, "text", None, 4, backend=backend)({"text": np.asarray(texts, dtype=object)})
    out[backend] = {k: np.asarray(v).tolist() for k, v in rows.items() if k != "text"}
print(json.dumps(out))
"""


def test_predict_takes_a_hub_id_offline_for_a_model_and_an_export(exported, tmp_path):
    import numpy as np

    from albert_dist.finetune.predict import Predictor

    cached_snapshot(tmp_path / "hub", "me/lcqmc", files=exported / "model")
    cached_snapshot(tmp_path / "hub", "me/lcqmc-onnx", files=exported / "export")
    texts = [*ZH_SENTENCES[:3], *MIXED]
    out = run_offline(tmp_path, OFFLINE_PREDICTS, json.dumps(texts))
    for backend, directory in (("torch", exported / "model"), ("onnx", exported / "export")):
        local = Predictor(directory, "text", None, 4, backend=backend)({"text": np.asarray(texts, dtype=object)})
        assert out[backend].keys() == {k for k in local if k != "text"}
        assert out[backend]["predicted_label"] == np.asarray(local["predicted_label"]).tolist()
        for key in out[backend].keys() - {"predicted_label"}:  # the probabilities
            np.testing.assert_allclose(np.asarray(out[backend][key]), np.asarray(local[key]), atol=1e-5)


def albert_dist(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "albert_dist.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_push_uploads_an_export_in_one_commit_with_the_token_unseen(exported, tmp_path):
    token = "hf_" + "s3cr3t" * 6
    env = os.environ | {"PYTHONPATH": str(ROOT), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_TOKEN", None)
    export = exported / "export"
    with HubStandIn(token) as hub:
        env["HF_ENDPOINT"] = hub.url
        dry = albert_dist("push", "--model", str(export), "--repo", "me/tiny-zh", "--dry-run", env=env)
        assert dry.returncode == 0, dry.stderr
        assert "me/tiny-zh (public): " in dry.stdout and "tokenizer.json" in dry.stdout and "dry run" in dry.stdout
        assert hub.repos == hub.commits == []
        no_token = albert_dist("push", "--model", str(export), "--repo", "me/tiny-zh", env=env)
        assert no_token.returncode != 0 and "no Hugging Face token: set HF_TOKEN" in no_token.stderr
        bad_repo = albert_dist("push", "--model", str(export), "--repo", "tiny-zh", env=env)
        assert bad_repo.returncode != 0 and "--repo 'tiny-zh'" in bad_repo.stderr
        pushed = albert_dist(
            "push", "--model", str(export), "--repo", "me/tiny-zh", "--private", env=env | {"HF_TOKEN": token}
        )
        assert pushed.returncode == 0, pushed.stderr
        refused = albert_dist("push", "--model", str(export), "--repo", "me/tiny-zh", env=env | {"HF_TOKEN": "hf_no"})
        assert refused.returncode != 0 and "401" in refused.stderr and len(refused.stderr.splitlines()) == 1
    for run in (dry, no_token, pushed, refused):
        assert token not in run.stdout + run.stderr
    assert hub.unknown == []
    assert hub.repos == [{"name": "tiny-zh", "organization": "me", "visibility": "private"}]
    (commit,) = hub.commits
    assert commit["repo"] == "me/tiny-zh"
    local = {p.name for p in export.iterdir() if p.is_file() and p.name != "published.json"}
    assert set(commit["files"]) == local
    for name in local - {"README.md"}:
        assert commit["files"][name] == (export / name).read_bytes()
    readme = commit["files"]["README.md"].decode()
    assert 'from_pretrained("me/tiny-zh")' not in readme  # an export loads through albert-dist
    assert "--model me/tiny-zh --backend onnx" in readme and "path/to/this/model" not in readme
    assert hub.validated == [readme]


def test_a_sentencepiece_model_carries_a_fast_tokenizer_with_our_ids(stdlib_corpus, tmp_path):
    import transformers

    from albert_dist.tokenizer.training import train_sentencepiece

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(stdlib_corpus.read_text(encoding="utf-8") + "\n".join(ZH_SENTENCES * 20), encoding="utf-8")
    train_sentencepiece([corpus], tmp_path / "trained", 2000, input_sentence_size=20_000, progress=lambda _: None)
    ours = AlbertTokenizer(tmp_path / "trained")
    ours.save(tmp_path / "model")
    (tmp_path / "model" / "spiece.model").unlink()  # transformers reads tokenizer.json alone
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "model")
    assert hf.is_fast
    lines = [line for line in stdlib_corpus.read_text(encoding="utf-8").splitlines() if line.strip()][:1000]
    extra = [
        "  Café  naïve ``quoted'' text\twith\ttabs\n and newlines  ",
        'HELLO (a-b) "x" £5 €3 – dash',
        "ＡＢＣ１２３",
    ]
    # not compared: a digit before a comma (google's re-split of `1,` pieces, which the fast tokenizer only
    # approximates) and literal special tokens ([MASK] in the text: transformers matches it, we read it as text)
    texts = [t for t in [*lines, *extra, *ZH_SENTENCES, *MIXED] if not re.search(r"\d,|\[(CLS|SEP|MASK)\]", t)]
    assert len(texts) > 900
    for text in texts:
        assert hf(text)["input_ids"] == [ours.cls_id, *ours.encode(text), ours.sep_id], text
    pair, expected = hf(MIXED[0], lines[0], return_token_type_ids=True), ours.encode_pair(MIXED[0], lines[0])
    assert (pair["input_ids"], pair["token_type_ids"]) == (expected["input_ids"], expected["token_type_ids"])
