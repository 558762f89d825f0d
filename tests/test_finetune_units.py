"""Fine-tuning pieces without training: metrics, ALBERT-aware learning rates, schedule, data reading and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from finetune_helpers import write_csv, write_jsonl

from albert_dist.config import TrainSection, validate_config
from albert_dist.data import batching
from albert_dist.errors import ConfigError, DataError
from albert_dist.finetune import data, lr_groups, metrics
from albert_dist.finetune.config import FinetuneJobConfig, FinetuneSection, TaskDataSection
from albert_dist.finetune.distill import distillation_loss, teacher_layer
from albert_dist.finetune.job import schedule, source_run_id
from albert_dist.finetune.task import EarlyStopping, global_batches
from albert_dist.model import AlbertConfig, AlbertForSequenceClassification

# ----------------------------------------------------------------------------------------------------- metrics


def test_binary_metrics_match_hand_computation():
    # tp=3 fn=1 fp=2 tn=4
    labels = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
    preds = np.array([1, 1, 1, 0, 1, 1, 0, 0, 0, 0])
    m = metrics.classification_metrics(metrics.confusion_matrix(preds, labels, 2))
    assert m["accuracy"] == pytest.approx(0.7)
    f1_pos, f1_neg = 2 * 3 / (2 * 3 + 2 + 1), 2 * 4 / (2 * 4 + 1 + 2)
    assert m["f1"] == pytest.approx((f1_pos + f1_neg) / 2)
    assert m["mcc"] == pytest.approx((3 * 4 - 2 * 1) / math.sqrt(5 * 4 * 6 * 5))


def test_multiclass_mcc_and_degenerate_cases():
    confusion = np.array([[2, 1, 0], [0, 3, 0], [1, 0, 1]])
    m = metrics.classification_metrics(confusion)
    s, c = 8, 6
    t, p = np.array([3, 3, 2]), np.array([3, 4, 1])
    expected = (c * s - (t * p).sum()) / math.sqrt((s**2 - (p**2).sum()) * (s**2 - (t**2).sum()))
    assert m["mcc"] == pytest.approx(expected)
    assert m["accuracy"] == pytest.approx(6 / 8)
    constant = metrics.classification_metrics(metrics.confusion_matrix(np.zeros(4), np.array([0, 0, 1, 1]), 2))
    assert constant["mcc"] == 0.0 and constant["f1"] == pytest.approx((2 * 2 / 6 + 0) / 2)


def test_pearson_and_spearman_with_ties():
    x, y = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 5.0, 9.0])
    dx, dy = x - 2.5, y - 5.0
    assert metrics.pearson(x, y) == pytest.approx((dx * dy).sum() / math.sqrt((dx**2).sum() * (dy**2).sum()))
    assert metrics.spearman(x, y**3) == pytest.approx(1.0)
    assert list(metrics.average_ranks(np.array([10, 20, 10, 30]))) == [1.5, 3.0, 1.5, 4.0]
    # ranks (1.5, 1.5, 3, 4) vs (1, 2, 3, 4)
    assert metrics.spearman(np.array([1, 1, 2, 3]), x) == pytest.approx(metrics.pearson([1.5, 1.5, 3, 4], [1, 2, 3, 4]))
    assert metrics.pearson(np.ones(3), x[:3]) == 0.0


# ---------------------------------------------------------------------------------------------- learning rates


def tiny_classifier(groups: int = 2) -> AlbertForSequenceClassification:
    return AlbertForSequenceClassification(
        AlbertConfig(
            vocab_size=50,
            embedding_size=8,
            hidden_size=16,
            num_hidden_layers=4,
            num_hidden_groups=groups,
            num_attention_heads=2,
            intermediate_size=16,
        )
    )


def test_parameter_to_group_to_scale():
    assert lr_groups.group_of("albert.embeddings.word_embeddings.weight") == "embeddings"
    assert lr_groups.group_of("albert.encoder.embedding_hidden_mapping_in.bias") == "embeddings"
    assert lr_groups.group_of("albert.encoder.albert_layer_groups.1.albert_layers.0.ffn.weight") == "group1"
    assert lr_groups.group_of("student.albert.encoder.albert_layer_groups.0.albert_layers.0.ffn.bias") == "group0"
    assert lr_groups.group_of("albert.pooler.weight") == "head"
    assert lr_groups.group_of("classifier.weight") == "head"
    assert lr_groups.lr_scales(2, 0.5) == {"head": 1.0, "group1": 0.5, "group0": 0.25, "embeddings": 0.125}
    assert lr_groups.lr_scales(1, 0.8) == pytest.approx({"head": 1.0, "group0": 0.8, "embeddings": 0.64})


def test_optimizer_groups_carry_scales_and_freeze():
    model = tiny_classifier(groups=2)
    groups = lr_groups.albert_parameter_groups(model, 2, 0.01, 0.5, {"embeddings": 0.0})
    scale_of = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    for name, param in model.named_parameters():
        expected = {"head": 1.0, "group1": 0.5, "group0": 0.25, "embeddings": 0.0}[lr_groups.group_of(name)]
        if expected == 0.0:
            assert not param.requires_grad and id(param) not in scale_of, name
        else:
            assert scale_of[id(param)] == expected, name
    with pytest.raises(ConfigError, match="group5"):
        lr_groups.lr_scales(2, 1.0, {"group5": 0.0})
    with pytest.raises(ConfigError, match="unknown parameter group"):
        validate_config(FinetuneSection, {"lr_scales": {"layer3": 0.0}})


# ------------------------------------------------------------------------------------- schedule, batches, misc


def test_schedule_from_epochs_and_warmup_ratio():
    train, per_epoch = schedule(
        TrainSection(batch_size=8, grad_accum_steps=2),
        FinetuneSection(epochs=3, warmup_ratio=0.1),
        num_train=100,
        num_workers=2,
    )
    assert per_epoch == 6 and train.max_steps == 9 and train.warmup_steps == 1
    with pytest.raises(ConfigError, match="global batch"):
        schedule(TrainSection(batch_size=64), FinetuneSection(), num_train=100, num_workers=2)


def test_global_batches_cover_rows_once_across_ranks():
    for drop_last, count in ((False, 23), (True, 23)):
        seen = [
            i for rank in range(2) for s in global_batches(count, 4, rank, 2, drop_last) for i in range(s.start, s.stop)
        ]
        assert sorted(seen) == list(range(16 if drop_last else 23))


def test_early_stopping_counts_evaluations_without_improvement():
    stop = EarlyStopping("eval_accuracy", "max", patience=2)
    assert [stop({"eval_accuracy": v}) for v in (0.5, 0.6, 0.6, 0.55)] == [False, False, False, True]
    assert not EarlyStopping("eval_accuracy", "max", None)({"eval_accuracy": 0.1})


def test_early_stopping_goes_on_counting_after_a_resume(tmp_path):
    """Its state travels in the checkpoint: a run resumed after one evaluation without improvement stops after
    the next one (patience 2), as the uninterrupted run does."""
    from albert_dist.train import checkpointing

    stop = EarlyStopping("eval_accuracy", "max", patience=2)
    assert [stop({"eval_accuracy": v}) for v in (0.6, 0.55)] == [False, False]
    checkpointing.save_training_state(tmp_path, {"task": stop.state()}, {"step": 2})
    resumed = EarlyStopping("eval_accuracy", "max", patience=2)
    resumed.restore(checkpointing.load_training_state(tmp_path)["task"])
    assert resumed({"eval_accuracy": 0.59}) and not EarlyStopping("eval_accuracy", "max", 2)({"eval_accuracy": 0.59})


def test_distillation_pieces():
    assert [teacher_layer(i, 4, 12) for i in (1, 2, 3, 4)] == [3, 6, 9, 12]
    assert teacher_layer(2, 2, 3) == 3
    import torch

    logits = torch.tensor([[2.0, -1.0], [0.5, 0.3]])
    loss, kd, ce = distillation_loss(logits, logits, torch.tensor([0, 1]), 2.0, 0.5)
    assert kd.item() == pytest.approx(0.0, abs=1e-6) and loss.item() == pytest.approx(0.5 * ce.item())


def test_source_run_id_found_beside_the_model(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "mlflow_run_id").write_text("abc123\n")
    assert source_run_id(tmp_path / "model") == "abc123"
    assert source_run_id(tmp_path / "model" / "nothing") is None


def test_metric_must_fit_task():
    with pytest.raises(ConfigError, match="does not apply"):
        validate_config(FinetuneSection, {"task": "regression", "metric": "f1"})
    assert FinetuneSection(task="regression").best_metric == "pearson"
    with pytest.raises(ConfigError, match="finetune.epoch: unknown key"):
        validate_config(FinetuneJobConfig, {"finetune": {"epoch": 3}})


# ------------------------------------------------------------------------------------------------ data + errors


def rows(n=20):
    return [{"text": f"text number {i}", "other": "x", "label": "yes" if i % 2 else "no"} for i in range(n)]


def test_seeded_split_and_label_names(tmp_path):
    path = write_csv(tmp_path / "train.csv", rows(50))
    section = TaskDataSection(train=str(path), dev_fraction=0.2, test_fraction=0.1)
    splits = data.load_splits(section)
    assert [len(splits[k].texts) for k in ("train", "dev", "test")] == [35, 10, 5]
    assert sorted(splits["train"].texts + splits["dev"].texts + splits["test"].texts) == sorted(
        r["text"] for r in rows(50)
    )
    assert data.load_splits(section)["dev"].texts == splits["dev"].texts  # seeded
    assert data.label_names(splits["train"], None) == ["no", "yes"]
    numeric = data.Split("x", ["a"] * 3, None, [10, 2, 1])
    assert data.label_names(numeric, None) == ["1", "2", "10"]


def test_reads_every_format(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows(6))
    pq.write_table(table, tmp_path / "d.parquet")
    write_jsonl(tmp_path / "d.jsonl", rows(6))
    write_csv(tmp_path / "d.csv", rows(6))
    (tmp_path / "d.tsv").write_text(
        "text\tother\tlabel\n" + "".join(f'{r["text"]} "q\tx\t{r["label"]}\n' for r in rows(6))
    )
    for name in ("d.parquet", "d.jsonl", "d.csv", "d.tsv"):
        split = data.read_split(str(tmp_path / name), TaskDataSection(), "label")
        assert split.labels == [r["label"] for r in rows(6)], name
        assert split.texts[1].startswith("text number 1"), name


def test_bad_input_errors_name_file_and_column(tmp_path):
    good = write_csv(tmp_path / "train.csv", rows())
    no_label = write_csv(tmp_path / "nolabel.csv", [{"text": "a", "tag": "yes"}])
    with pytest.raises(DataError, match=r"nolabel\.csv.*'label'"):
        data.read_split(str(no_label), TaskDataSection(), "label")
    with pytest.raises(DataError, match=r"train\.csv.*'sentence2'"):
        data.read_split(str(good), TaskDataSection(text_pair_column="sentence2"), "label")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataError, match=r"empty.*empty\.csv"):
        data.read_table(tmp_path / "empty.csv")
    (tmp_path / "header.csv").write_text("text,label\n")
    with pytest.raises(DataError, match=r"no rows.*header\.csv"):
        data.read_table(tmp_path / "header.csv")
    with pytest.raises(DataError, match=r"not found.*missing\.csv"):
        data.read_table(tmp_path / "missing.csv")
    dev = data.read_split(
        str(write_csv(tmp_path / "dev.csv", [{"text": "a", "label": "maybe"}])), TaskDataSection(), "label"
    )
    with pytest.raises(DataError, match=r"dev\.csv.*unknown label 'maybe'.*'label'"):
        data.label_ids(dev, "label", "classification", {"no": 0, "yes": 1})
    with pytest.raises(DataError, match=r"dev\.csv.*'label'.*'maybe'.*not a number"):
        data.label_ids(dev, "label", "regression", {})
    with pytest.raises(ConfigError, match="data.train"):
        data.load_splits(TaskDataSection())


def test_collate_pads_to_multiple_of_eight():
    arrays = {
        "input_ids": np.arange(40, dtype=np.int32).reshape(2, 20),
        "token_type_ids": np.zeros((2, 20), np.int8),
        "length": np.array([5, 9], np.int32),
        "label": np.array([0, 1]),
        "row": np.array([0, 1]),
    }
    batch = batching.collate(arrays, 8)
    assert batch["input_ids"].shape == (2, 16)
    assert batch["attention_mask"].sum(1).tolist() == [5, 9]


def test_a_repeated_column_is_a_data_error(tmp_path):
    """Found by the property test: a header naming a column twice broke deep inside pyarrow."""
    from albert_dist.errors import DataError
    from albert_dist.finetune.data import read_table

    (tmp_path / "twice.csv").write_text("text,label,text\na,0,b\n")
    with pytest.raises(DataError, match="column 'text' appears more than once"):
        read_table(tmp_path / "twice.csv")


def test_a_file_in_another_encoding_is_refused_naming_its_line(tmp_path):
    """pyarrow reads a GBK column of a CSV as bytes (their repr would be the training text) and replaces the
    characters of GBK JSON: both stop, naming the first undecodable line; a UTF-8 file with a byte-order mark
    reads."""
    rows = "text,label\n今天天气很好,1\n我不喜欢下雨,0\n"
    (tmp_path / "gbk.csv").write_bytes(rows.encode("gbk"))
    (tmp_path / "gbk.jsonl").write_bytes(
        '{"text": "ok", "label": 0}\n{"text": "今天天气很好", "label": 1}\n'.encode("gbk")
    )
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + rows.encode())
    with pytest.raises(
        DataError, match=r"gbk.csv: not UTF-8 text \(line 2, byte 0xbd\); it reads as Chinese in GB18030"
    ):
        data.read_table(tmp_path / "gbk.csv")
    with pytest.raises(DataError, match=r"gbk.jsonl: not UTF-8 text \(line 2, byte 0xbd\)"):
        data.read_table(tmp_path / "gbk.jsonl")
    (tmp_path / "utf16.csv").write_bytes("text,label\nplain English,1\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"utf16.csv: not UTF-8 text \(line 1, byte 0xff\); it is UTF-16"):
        data.read_table(tmp_path / "utf16.csv")
    (tmp_path / "nul.tsv").write_bytes("text\tlabel\nplain\t1\n".encode("utf-16-le"))
    with pytest.raises(DataError, match=r"nul.tsv: not UTF-8 text \(line 1, byte 0x00\); it is UTF-16"):
        data.read_table(tmp_path / "nul.tsv")
    table = data.read_table(tmp_path / "bom.csv")
    assert table.column_names == ["text", "label"] and data.text_values(table, "text") == [
        "今天天气很好",
        "我不喜欢下雨",
    ]


def test_long_texts_as_windows_and_their_mean(tmp_path):
    """Every piece of a long text is in a window, windows share the overlap, and a text's value is the mean of its
    windows'."""
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
    from albert_dist.tokenizer.training import train_wordpiece

    corpus = tmp_path / "c.txt"
    corpus.write_text("一二三四五六七八九十\n" * 20, encoding="utf-8")
    tokenizer = load_tokenizer(train_wordpiece(corpus, tmp_path / "tok", 100, progress=lambda _: None))
    texts = ["一二三", "一二三四五六七八九十" * 3]
    rows = batching.encode_windows(tokenizer, texts, 12, 4)
    assert rows["document"].tolist() == [0, 1, 1, 1, 1, 1]  # 30 pieces in windows of 10 moving by 6: 0, 6, 12, 18, 20
    pieces = [rows["input_ids"][i, 1 : rows["length"][i] - 1].tolist() for i in range(1, 6)]
    assert pieces[0] + pieces[1][4:] + pieces[2][4:] + pieces[3][4:] + pieces[4][8:] == tokenizer.encode(texts[1])
    means = batching.document_means(np.arange(12.0).reshape(6, 2), rows["document"])
    assert means.tolist() == [[0.0, 1.0], [6.0, 7.0]]


def test_predict_reads_long_texts_as_the_model_was_trained_to(tmp_path):
    """A model saved with a window overlap (`data.long_text: windows`) is told apart by what ends a long text; the
    same weights saved without one truncate, and two texts that differ only past the cut get the same prediction."""
    import torch

    from albert_dist.finetune import inference
    from albert_dist.finetune.predict import Predictor
    from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer
    from albert_dist.tokenizer.training import train_wordpiece

    corpus = tmp_path / "c.txt"
    corpus.write_text("一二三四五六七八九十北京上海\n" * 20, encoding="utf-8")
    tokenizer = load_tokenizer(train_wordpiece(corpus, tmp_path / "tok", 100, progress=lambda _: None))
    torch.manual_seed(0)
    config = AlbertConfig(
        vocab_size=tokenizer.vocab_size,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=2,
        id2label={0: "a", 1: "b"},
        label2id={"a": 0, "b": 1},
        initializer_range=0.5,  # random weights that tell texts apart clearly
    )
    texts = ["一二三四五六七八九十" * 4 + "北京" * 5, "一二三四五六七八九十" * 4 + "上海" * 5]
    probabilities = {}
    for name, overlap in (("windows", 4), ("truncate", None)):
        AlbertForSequenceClassification(config).save_pretrained(tmp_path / name)
        tokenizer.save(tmp_path / name)
        inference.save_reading(tmp_path / name, 16, overlap)
        out = Predictor(tmp_path / name, "text", None, 8, "fp32")({"text": np.asarray(texts, dtype=object)})
        probabilities[name] = out["prob_a"]
    assert probabilities["truncate"][0] == pytest.approx(probabilities["truncate"][1], abs=1e-6)  # float noise
    assert abs(probabilities["windows"][0] - probabilities["windows"][1]) > 2e-5
