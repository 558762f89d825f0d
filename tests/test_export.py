"""`albert-dist export`: every head exported and run by onnxruntime agrees with PyTorch at shapes the export never saw;
int8 is smaller and keeps the argmax of a trained model; transformers reads the export's config and tokenizer; the
command's output, its errors, and the check that refuses an export past its tolerance."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import onnx
import pytest
import torch
from finetune_helpers import sentence, single_rows, write_csv

import albert_dist.model as modeling
from albert_dist.cli import main
from albert_dist.errors import CheckpointError
from albert_dist.export import check
from albert_dist.export.dev_metrics import DevSet
from albert_dist.export.run import run_export
from albert_dist.model import AlbertConfig
from albert_dist.model.onnx_runtime import OnnxModel
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.training import train_sentencepiece

SHAPES = ((1, 9), (5, 23))  # (batch, length): neither traced (2, 16) nor checked at export (4, 16), (6, 37)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A SentencePiece tokenizer of the toy task's words."""
    root = tmp_path_factory.mktemp("tokenizer")
    rng = random.Random(0)
    corpus = root / "corpus.txt"
    corpus.write_text(
        "\n".join(sentence(rng, [rng.choice(["socket", "thread", "parser", "archive"])]) for _ in range(2000))
    )
    train_sentencepiece(corpus, root / "spm", 60, progress=lambda _: None)
    return root / "spm"


def model_dir(directory, tokenizer_dir, architecture: str, seed: int = 0, **overrides):
    """A random `architecture` with its tokenizer, saved as training saves one; weights large enough that every
    output depends on every token."""
    tokenizer = load_tokenizer(tokenizer_dir)
    settings = dict(
        vocab_size=tokenizer.vocab_size,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        initializer_range=0.1,
    )
    torch.manual_seed(seed)
    getattr(modeling, architecture)(AlbertConfig(**{**settings, **overrides})).save_pretrained(directory)
    tokenizer.save(directory)
    return directory


def inputs(config, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Random ids, two segments, right padding of varying length (the first row full)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, length), generator=generator)
    lengths = torch.randint(2, length + 1, (batch,), generator=generator)
    lengths[0] = length
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    types = ((torch.arange(length)[None] >= lengths[:, None] // 2) & mask.bool()).long()
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types}


HEADS = [
    ("AlbertForSequenceClassification", {"num_labels": 3}),
    ("AlbertForSequenceClassification", {"num_labels": 1, "problem_type": "regression"}),
    ("AlbertForTokenClassification", {"num_labels": 5}),
    ("AlbertForQuestionAnswering", {}),
    ("AlbertForMaskedLM", {}),
    ("AlbertForPreTraining", {}),
    ("AlbertModel", {}),
]


@pytest.mark.parametrize(("architecture", "overrides"), HEADS, ids=lambda v: v if isinstance(v, str) else "")
def test_each_head_agrees_with_pytorch_at_shapes_the_export_never_saw(tmp_path, tokenizer_dir, architecture, overrides):
    source = model_dir(tmp_path / "model", tokenizer_dir, architecture, **overrides)
    exported = run_export(source, tmp_path / "onnx")
    model = getattr(modeling, architecture).from_pretrained(source)
    onnx_model = OnnxModel(tmp_path / "onnx")
    fill_mask = architecture == "AlbertForPreTraining"  # its masked LM is what is exported
    assert onnx_model.architecture == ("AlbertForMaskedLM" if fill_mask else architecture)
    assert exported["check"]["outputs"] and all(
        m["max_abs_diff"] <= 1e-4 for m in exported["check"]["outputs"].values()
    )
    for batch, length in SHAPES:
        x = inputs(model.config, batch, length, seed=batch)
        with torch.no_grad():
            expected = model(**x)
        got = onnx_model(**x)
        assert type(got) is (modeling.AlbertMaskedLMOutput if fill_mask else type(expected))
        for name in onnx_model.outputs:
            want = expected.prediction_logits if fill_mask else getattr(expected, name)
            assert getattr(got, name).shape == want.shape
            assert (getattr(got, name) - want).abs().max() <= 1e-4, name


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tokenizer_dir):
    """A 3-class classifier and its fp32 export, shared by the tests that only read them."""
    root = tmp_path_factory.mktemp("classifier")
    source = model_dir(root / "model", tokenizer_dir, "AlbertForSequenceClassification", num_labels=3)
    run_export(source, root / "onnx")
    return source, root / "onnx"


def test_onnx_model_takes_numpy_and_defaults_the_mask_and_token_types(classifier):
    source, exported = classifier
    onnx_model = OnnxModel(exported, intra_op_num_threads=1)
    assert onnx_model.session.get_session_options().intra_op_num_threads == 1
    model = modeling.AlbertForSequenceClassification.from_pretrained(source)
    ids = inputs(model.config, 3, 12, seed=0)["input_ids"]
    with torch.no_grad():
        expected = model(input_ids=ids).logits  # no mask: every position attended, token type 0
    assert (onnx_model(input_ids=ids.numpy().astype(np.int32)).logits - expected).abs().max() <= 1e-4


def trained_classifier(directory, tokenizer_dir, rows, steps: int = 60):
    """A small classifier trained on the toy keyword task until its dev predictions mean something."""
    tokenizer = load_tokenizer(tokenizer_dir)
    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=tokenizer.vocab_size,
        embedding_size=32,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=64,
        id2label={0: "no", 1: "yes"},
        classifier_dropout_prob=0.0,
    )
    model = modeling.AlbertForSequenceClassification(config)
    batch = tokenizer.batch_encode([r["text"] for r in rows], return_tensors="pt")
    labels = torch.tensor([config.label2id[r["label"]] for r in rows])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    # Steps this small run 30 times slower on two threads when another process keeps the other core busy (the
    # suite runs two): the threads spin waiting for each other.
    torch.set_num_threads(1)
    try:
        for step in range(steps):
            pick = torch.arange(step * 32, step * 32 + 32) % len(rows)
            loss = model(**{k: v[pick] for k, v in batch.items()}, labels=labels[pick]).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(threads)
    model.eval().save_pretrained(directory)
    tokenizer.save(directory)
    return directory


def test_int8_is_smaller_and_keeps_a_trained_models_predictions(tmp_path, tokenizer_dir):
    source = trained_classifier(tmp_path / "model", tokenizer_dir, single_rows(400, seed=1))
    dev = write_csv(tmp_path / "dev.csv", single_rows(120, seed=2))
    int8 = run_export(source, tmp_path / "int8", quantize="int8", dev=DevSet(str(dev)))
    assert int8["sizes"]["model.onnx"] < 0.6 * int8["sizes"]["fp32_onnx"]
    scores = int8["dev"]
    assert scores["rows"] == 120 and scores["pytorch_fp32"]["accuracy"] >= 0.8  # it learned the task
    assert abs(scores["onnx_int8"]["accuracy"] - scores["pytorch_fp32"]["accuracy"]) <= 0.01
    tokenizer, model = load_tokenizer(source), modeling.AlbertForSequenceClassification.from_pretrained(source)
    batch = tokenizer.batch_encode([r["text"] for r in single_rows(120, seed=2)], return_tensors="pt")
    with torch.no_grad():
        expected = model(**batch).logits.argmax(-1)
    assert (OnnxModel(tmp_path / "int8")(**batch).logits.argmax(-1) == expected).float().mean() >= 0.98
    assert int8["check"]["outputs"]["logits"]["argmax_agreement"] >= check.TOLERANCES["int8"].min_agreement


def test_fp16_halves_the_model_and_passes_its_check(tmp_path, tokenizer_dir):
    source = model_dir(tmp_path / "model", tokenizer_dir, "AlbertForTokenClassification", num_labels=4)
    exported = run_export(source, tmp_path / "fp16", quantize="fp16")
    assert exported["sizes"]["model.onnx"] < 0.7 * exported["sizes"]["fp32_onnx"]
    initializers = onnx.load(tmp_path / "fp16" / "model.onnx").graph.initializer
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in initializers)
    logits = exported["check"]["outputs"]["logits"]
    assert 0 < logits["max_abs_diff"] <= logits["bound"]


def test_transformers_reads_the_exports_config_and_tokenizer(classifier):
    import transformers

    source, exported = classifier
    config = transformers.AutoConfig.from_pretrained(exported)
    assert config.architectures == ["AlbertForSequenceClassification"] and config.num_labels == 3
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    texts, pairs = ["the socket returns a value", "a parser"], ["of the list", "when an error is raised in this module"]
    ours = load_tokenizer(source).batch_encode(texts, pairs, return_tensors="pt")
    theirs = hf_tokenizer(texts, pairs, padding=True, return_token_type_ids=True, return_tensors="np")
    for name in ("input_ids", "token_type_ids", "attention_mask"):
        assert theirs[name].tolist() == ours[name].tolist(), name
    model = modeling.AlbertForSequenceClassification.from_pretrained(source)
    with torch.no_grad():
        expected = model(**ours).logits
    got = OnnxModel(exported)(**theirs)  # what transformers' tokenizer returns, as it returns it
    assert (got.logits - expected).abs().max() <= 1e-4


def test_the_command_writes_the_export_and_replaces_an_earlier_one(tmp_path, tokenizer_dir, capsys):
    source = model_dir(tmp_path / "model", tokenizer_dir, "AlbertForQuestionAnswering")
    out = tmp_path / "out"
    assert main(["export", "--model", str(source), "--output", str(out), "--quantize", "int8", "--opset", "18"]) == 0
    printed = capsys.readouterr().out
    assert f"exported AlbertForQuestionAnswering as ONNX (int8, opset 18) to {out}" in printed
    assert "start_logits: max abs diff" in printed
    tokenizer_files = {p.name for p in source.iterdir()} - {"config.json", "model.safetensors"}
    assert tokenizer_files == {"spiece.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert {p.name for p in out.iterdir()} == {
        "config.json",
        "model.onnx",
        "export.json",
        "README.md",
    } | tokenizer_files
    metadata = json.loads((out / "export.json").read_text())
    assert (metadata["quantization"], metadata["opset"]) == ("int8", 18)
    assert {o.domain or "ai.onnx": o.version for o in onnx.load(out / "model.onnx").opset_import}["ai.onnx"] == 18
    assert main(["export", "--model", str(source), "--output", str(out)]) == 0  # an earlier export is replaced
    assert json.loads((out / "export.json").read_text())["quantization"] == "none"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing model", "does not exist"),
        ("not an export's directory", "refusing to publish to"),
        ("dev of a token classifier", "--dev scores sequence classification and regression models"),
        ("opset too old", "--opset 12 is out of range"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, tokenizer_dir, capsys, case, message):
    source = model_dir(tmp_path / "model", tokenizer_dir, "AlbertForTokenClassification", num_labels=3)
    out = tmp_path / "out"
    argv = ["export", "--model", str(source), "--output", str(out)]
    if case == "missing model":
        argv[2] = str(tmp_path / "nowhere")
    elif case == "not an export's directory":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case == "dev of a token classifier":
        argv += ["--dev", str(write_csv(tmp_path / "dev.csv", single_rows(4, seed=0)))]
    else:
        argv += ["--opset", "12"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("albert-dist: error: ") and message in err and err.count("\n") == 1
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert left == (["notes.txt"] if case == "not an export's directory" else [])


def test_the_check_refuses_a_model_past_its_tolerance(tmp_path, classifier, monkeypatch):
    source, exported = classifier
    shutil.copytree(exported, tmp_path / "out")
    model = modeling.AlbertForSequenceClassification.from_pretrained(source)
    proto = onnx.load(tmp_path / "out" / "model.onnx")  # logits + 1e-3: what a slightly wrong graph gives
    producer = next(node for node in proto.graph.node if "logits" in node.output)
    producer.output[list(producer.output).index("logits")] = "logits_before"
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(1e-3, np.float32), "shift"))
    proto.graph.node.append(onnx.helper.make_node("Add", ["logits_before", "shift"], ["logits"]))
    onnx.save(proto, tmp_path / "out" / "model.onnx")
    with pytest.raises(check.ExportCheckError, match=r"logits differs from PyTorch's by up to 0\.001"):
        check.compare(model, OnnxModel(tmp_path / "out"), check.TOLERANCES["none"])

    # int8 held to fp32's tolerance: the export fails and the export at --output stays as it was
    before = (tmp_path / "out" / "model.onnx").read_bytes()
    monkeypatch.setitem(check.TOLERANCES, "int8", check.TOLERANCES["none"])
    with pytest.raises(check.ExportCheckError, match="past the bound 0.0001"):
        run_export(source, tmp_path / "out", quantize="int8")
    assert (tmp_path / "out" / "model.onnx").read_bytes() == before
    assert json.loads((tmp_path / "out" / "export.json").read_text())["quantization"] == "none"


def test_a_directory_without_an_export_is_refused(tmp_path, tokenizer_dir):
    source = model_dir(tmp_path / "model", tokenizer_dir, "AlbertModel")
    with pytest.raises(CheckpointError, match="holds no model.onnx"):
        OnnxModel(source)


def test_dev_metrics_go_to_the_models_mlflow_run(tmp_path, tokenizer_dir):
    from albert_dist.tracking import run as tracking

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"  # where a run with the default store keeps it
    run_id = tracking.start_or_resume_run(store, "albert-dist", tmp_path / "finetune", "finetune")
    tracking.finish_run(store, run_id)
    source = trained_classifier(tmp_path / "finetune" / "model", tokenizer_dir, single_rows(200, seed=1), steps=20)
    dev = write_csv(tmp_path / "dev.csv", single_rows(40, seed=2))
    exported = run_export(source, tmp_path / "onnx", quantize="int8", dev=DevSet(str(dev)))
    assert exported["mlflow"]["logged"] and exported["mlflow"]["run_id"] == run_id
    logged = tracking.mlflow_client(store).get_run(run_id).data.metrics
    for model in ("pytorch_fp32", "onnx_int8"):
        for name, value in exported["dev"][model].items():
            assert logged[f"export_{model}_dev_{name}"] == pytest.approx(value)
