"""`albert-dist predict` in this process: input columns kept, rows back in input order after the length sort,
truncation at the length saved with the model."""

import random

import numpy as np
import pytest
import torch
from finetune_helpers import sentence, write_csv

from albert_dist.cli import main
from albert_dist.errors import DataError
from albert_dist.finetune import data, inference
from albert_dist.finetune.predict import run_predict
from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
from albert_dist.tokenizer.training import train_sentencepiece

SAVED_LENGTH = 16


@pytest.fixture(scope="module")
def model_dir(stdlib_corpus, tmp_path_factory):
    """A randomly initialised 2-class classifier with its tokenizer, saved as fine-tuning saves one."""
    directory = tmp_path_factory.mktemp("classifier")
    train_sentencepiece(stdlib_corpus, directory, 600, progress=lambda _: None)
    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=load_tokenizer(directory).vocab_size,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=2,
        max_position_embeddings=128,
        id2label={0: "neg", 1: "pos"},
        label2id={"neg": 0, "pos": 1},
        initializer_range=0.5,
    )  # large random weights: outputs that depend on every token
    AlbertForSequenceClassification(config).save_pretrained(directory)
    load_tokenizer(directory).save(directory)
    inference.save_max_seq_length(directory, SAVED_LENGTH)
    return directory


def row_probabilities(model_dir, texts, max_seq_length):
    """Each row alone through the model (no batching, no sorting): the reference."""
    model = AlbertForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    out = []
    with torch.no_grad():
        for text in texts:
            row = tokenizer.encode_pair(text, None, max_seq_length)
            logits = model(
                input_ids=torch.tensor([row["input_ids"]]), token_type_ids=torch.tensor([row["token_type_ids"]])
            ).logits
            out.append(torch.softmax(logits, -1)[0].numpy())
    return np.array(out)


def test_predict_keeps_columns_restores_order_and_truncates_at_the_saved_length(model_dir, tmp_path):
    rng = random.Random(0)
    rows = [
        {"id": i, "text": sentence(rng, [], 2 + 2 * i), "label": rng.choice(["neg", "pos"])} for i in range(24)
    ]  # 2 to 48 words: many beyond 16 tokens
    source = write_csv(tmp_path / "in.csv", rows)
    # fp32: the reference below runs in fp32, and `auto` picks bf16 on CPUs with native bf16 (1e-2 apart)
    assert run_predict(model_dir, source, tmp_path / "out.jsonl", batch_size=4, precision="fp32") == 24
    table = data.read_table(tmp_path / "out.jsonl").to_pydict()
    assert [table[k] for k in ("id", "text", "label")] == [[r[k] for r in rows] for k in ("id", "text", "label")]
    probabilities = np.array([table["prob_neg"], table["prob_pos"]]).T
    texts = [r["text"] for r in rows]
    np.testing.assert_allclose(probabilities, row_probabilities(model_dir, texts, SAVED_LENGTH), atol=1e-5)
    assert table["predicted_label"] == [["neg", "pos"][i] for i in probabilities.argmax(1)]
    untruncated = row_probabilities(model_dir, texts, 128)
    assert np.abs(probabilities - untruncated).max() > 1e-3  # the saved length did cut the long rows


def test_the_command_predicts_in_the_precision_it_is_given(model_dir, tmp_path, capsys):
    """`albert-dist predict --precision`: bf16 writes bf16's probabilities (off fp32's by up to ~1e-2, measured),
    fp32 fp32's to the last digit, whatever `auto` would pick on this CPU; fp16 on a CPU is refused in a line."""
    source = write_csv(tmp_path / "in.csv", [{"text": sentence(random.Random(i), [], 12)} for i in range(8)])
    probabilities = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"{precision}.parquet"
        assert (
            main(
                [
                    "predict",
                    "--model",
                    str(model_dir),
                    "--input",
                    str(source),
                    "--output",
                    str(out),
                    "--precision",
                    precision,
                ]
            )
            == 0
        )
        probabilities[precision] = np.array(data.read_table(out).column("prob_pos").to_pylist())
    reference = row_probabilities(model_dir, [r["text"] for r in data.read_table(source).to_pylist()], SAVED_LENGTH)
    np.testing.assert_allclose(probabilities["fp32"], reference[:, 1], atol=1e-5)
    assert np.abs(probabilities["bf16"] - probabilities["fp32"]).max() > 1e-4
    assert (
        main(
            [
                "predict",
                "--model",
                str(model_dir),
                "--input",
                str(source),
                "--output",
                str(tmp_path / "fp16.csv"),
                "--precision",
                "fp16",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        "albert-dist: error: precision fp16 needs a GPU (training: scaling.use_gpu=true); use bf16 or fp32 on CPU\n"
    )
    assert not (tmp_path / "fp16.csv").exists()


def test_a_column_the_prediction_would_write_is_refused(model_dir, tmp_path):
    source = write_csv(tmp_path / "in.csv", [{"text": "a b c", "prob_pos": 0.5}])
    with pytest.raises(DataError, match="'prob_pos' would be overwritten"):
        run_predict(model_dir, source, tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists()


def test_models_without_a_saved_length_truncate_at_512(tmp_path):
    assert inference.saved_max_seq_length(tmp_path) == 512  # no tokenizer_config.json (a foreign model dir)
    (tmp_path / "tokenizer_config.json").write_text('{"model_max_length": 1000000000000000019884624838656}')
    assert inference.saved_max_seq_length(tmp_path) == 512  # transformers' "no limit" placeholder
    inference.save_max_seq_length(tmp_path, 64)
    assert inference.saved_max_seq_length(tmp_path) == 64
