"""Chinese checkpoints both ways and the CLUE job configs.

A directory laid out like voidful/albert_chinese_* (BERT-style config.json without model_type, weights that
transformers wrote, vocab.txt, tokenizer_config.json naming BertTokenizer) is fine-tuned with clue_lcqmc.yaml on
Ray Train, predicts and is distilled into a student of another width started from its own pretrained directory;
what we publish loads in transformers with AutoTokenizer / AlbertForSequenceClassification, with the same ids
and logits. The AFQMC and TNEWS configs read their layouts.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from chinese_helpers import ZH_SENTENCES

from albert_dist.config import load_config
from albert_dist.errors import ConfigError
from albert_dist.finetune.config import DistillJobConfig, FinetuneJobConfig
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parents[1] / "albert_dist" / "configs"
LATIN = ["albert", "bert", "ray", "data", "deep", "learning", "##s", "##ing"]
# voidful/albert_chinese_*'s config.json: BERT-era keys, no model_type or architectures
VOIDFUL_EXTRAS = {
    "directionality": "bidi",
    "pooler_fc_size": 768,
    "pooler_num_attention_heads": 12,
    "pooler_num_fc_layers": 3,
    "pooler_size_per_head": 128,
    "pooler_type": "first_token_transform",
}


def bert_chinese_vocab() -> list[str]:
    """bert-base-chinese's layout in small: [PAD], [unusedN] entries, then [UNK] [CLS] [SEP] [MASK] (ids that
    ALBERT's layout would not guess), the characters and their `##` forms, Latin pieces."""
    chars = sorted({c for c in "".join(ZH_SENTENCES).lower() if not c.isspace()} - set("abcdefghijklmnopqrstuvwxyz"))
    return [
        "[PAD]",
        "[unused1]",
        "[unused2]",
        "[unused3]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *chars,
        *(f"##{c}" for c in chars),
        *LATIN,
        *"abcdefghijklmnopqrstuvwxyz",
        *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"),
    ]


def voidful_dir(directory: Path, hidden: int, layers: int, seed: int) -> Path:
    """A checkpoint written by transformers itself in the albert_chinese_* layout."""
    import transformers

    directory.mkdir(parents=True)
    (directory / "vocab.txt").write_text("\n".join(bert_chinese_vocab()) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(directory / "vocab.txt")).save_pretrained(directory)
    torch.manual_seed(seed)
    config = transformers.AlbertConfig(
        vocab_size=len(bert_chinese_vocab()),
        embedding_size=32,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        hidden_act="gelu",
        pad_token_id=0,
    )
    transformers.AlbertForMaskedLM(config).save_pretrained(directory)
    raw = {
        k: v
        for k, v in json.loads((directory / "config.json").read_text()).items()
        if k not in ("model_type", "architectures", "transformers_version")
    }
    (directory / "config.json").write_text(json.dumps({**raw, **VOIDFUL_EXTRAS}, indent=2))
    return directory


def lcqmc_rows(n: int, seed: int) -> list[tuple[str, str, int]]:
    """Pairs: label 1 when text_b is text_a's sentence with its first half and second half swapped around a
    comma-free cut, else another sentence."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a = rng.choice(ZH_SENTENCES)
        b = a if i % 2 == 0 else rng.choice([s for s in ZH_SENTENCES if s != a])
        rows.append((a, b, int(a == b)))
    return rows


def write_tsv(path: Path, rows) -> Path:
    path.write_text("text_a\ttext_b\tlabel\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("zh-ckpt")
    voidful_dir(root / "albert_chinese_small", hidden=64, layers=2, seed=0)
    voidful_dir(root / "albert_chinese_tiny", hidden=32, layers=1, seed=1)
    write_tsv(root / "train.tsv", lcqmc_rows(96, seed=1))
    write_tsv(root / "dev.tsv", lcqmc_rows(32, seed=2))
    return root


def clue_config(path: str, root: Path, overrides: list[str]):
    return load_config(
        FinetuneJobConfig,
        CONFIGS / path,
        [f"run.output_dir={root / 'runs'}", f"tracking.tracking_uri=sqlite:///{root}/mlflow.db", *overrides],
    )


@pytest.fixture(scope="module")
def lcqmc(workspace, ray_session):
    from albert_dist.finetune.job import FINETUNE

    cfg = clue_config(
        "clue_lcqmc.yaml",
        workspace,
        [
            f"model.init_from={workspace / 'albert_chinese_small'}",
            f"data.train={workspace / 'train.tsv'}",
            f"data.dev={workspace / 'dev.tsv'}",
            "data.test=",
            "data.max_seq_length=64",
            "scaling.num_workers=1",
            "scaling.cpus_per_worker=1",
            "finetune.epochs=1",
            "train.batch_size=16",
            "train.precision=fp32",
            "train.eval_every=6",
            "train.log_every=3",
            "train.learning_rate=1e-3",
        ],
    )
    return FINETUNE.run(cfg)


def test_voidful_layout_reads_with_transformers_ids_and_outputs(workspace):
    import transformers

    from albert_dist.model import AlbertModel
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    directory = workspace / "albert_chinese_small"
    ours = load_tokenizer(directory)
    assert (ours.kind, ours.unk_id, ours.cls_id, ours.mask_id) == ("wordpiece", 4, 5, 7)
    hf_tok = transformers.AutoTokenizer.from_pretrained(directory)
    inputs = ours.encode_pair(ZH_SENTENCES[3], ZH_SENTENCES[8])
    assert hf_tok(ZH_SENTENCES[3], ZH_SENTENCES[8], return_token_type_ids=True)["input_ids"] == inputs["input_ids"]
    tensors = {k: torch.tensor([v]) for k, v in inputs.items()}
    with torch.no_grad():
        mine = AlbertModel.from_pretrained(directory)(**tensors).last_hidden_state
        theirs = transformers.AlbertModel.from_pretrained(directory).eval()(**tensors).last_hidden_state
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_lcqmc_finetune_from_voidful_layout_exports_for_transformers(lcqmc, workspace, tmp_path):
    import huggingface_hub
    import transformers

    from albert_dist.finetune.predict import run_predict
    from albert_dist.model import AlbertForSequenceClassification
    from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

    assert lcqmc.label_names == ["0", "1"] and "dev_accuracy" in lcqmc.metrics
    hf_tok = transformers.AutoTokenizer.from_pretrained(lcqmc.model_dir)
    hf_model = transformers.AlbertForSequenceClassification.from_pretrained(lcqmc.model_dir).eval()
    ours, model = load_tokenizer(lcqmc.model_dir), AlbertForSequenceClassification.from_pretrained(lcqmc.model_dir)
    a, b = ZH_SENTENCES[4], ZH_SENTENCES[8]  # with English words: WordPiece pieces next to characters
    hf_inputs = hf_tok(a, b, return_tensors="pt")
    mine = ours.encode_pair(a, b)
    assert hf_inputs["input_ids"][0].tolist() == mine["input_ids"]
    with torch.no_grad():
        theirs = hf_model(**hf_inputs).logits
        logits = model(**{k: torch.tensor([v]) for k, v in mine.items()}).logits
    torch.testing.assert_close(logits, theirs, atol=1e-5, rtol=1e-4)

    # the fast tokenizer comes whole from tokenizer.json, and the model card tells where the model came from
    assert hf_tok.is_fast and (lcqmc.model_dir / "tokenizer.json").is_file()
    card = huggingface_hub.ModelCard.load(lcqmc.model_dir / "README.md")
    assert card.data.language == ["zh"] and card.data.pipeline_tag == "text-classification"
    assert {"albert", "albert-dist", "finetune"} <= set(card.data.tags)
    assert f"MLflow run: `{lcqmc.run_id}`" in card.text and str(workspace / "train.tsv") in card.text
    assert f"dev_accuracy | {lcqmc.metrics['dev_accuracy']:.6g}" in card.text and "digest (sha256)" in card.text
    assert "```yaml" in card.text and f"init_from: {workspace / 'albert_chinese_small'}" in card.text  # its config

    rows = run_predict(
        lcqmc.model_dir, workspace / "dev.tsv", tmp_path / "pred.jsonl", text_column="text_a", text_pair_column="text_b"
    )
    predictions = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text(encoding="utf-8").splitlines()]
    # the file's own columns are kept (its gold `label` as read), the prediction is `predicted_label`
    assert rows == 32 and {p["predicted_label"] for p in predictions} <= {"0", "1"}
    assert predictions[0]["text_a"] in ZH_SENTENCES and {p["label"] for p in predictions} <= {0, 1}


def test_student_of_another_width_starts_from_its_own_pretrained_dir(lcqmc, workspace):
    from albert_dist.finetune.distill import DistillationModel, build_student, distillation_loss
    from albert_dist.model import AlbertForSequenceClassification
    from albert_dist.model.checkpoint import load_state_dict

    teacher = AlbertForSequenceClassification.from_pretrained(lcqmc.model_dir)
    student_dir = workspace / "albert_chinese_tiny"
    cfg = DistillJobConfig.model_validate({"student": {"init_from": str(student_dir)}})
    student = build_student(teacher, cfg, lcqmc.model_dir)
    assert (student.config.hidden_size, teacher.config.hidden_size) == (32, 64)
    assert student.config.id2label == teacher.config.id2label
    pretrained = {k: v for k, v in load_state_dict(student_dir).items() if k.startswith("albert.")}
    assert len(pretrained) > 10 and all(torch.equal(v, student.state_dict()[k]) for k, v in pretrained.items())

    model = DistillationModel(student, teacher, match_hidden=True)
    assert model.projection.weight.shape == (64, 32)
    ids = torch.tensor([[5, 10, 11, 12, 6, 13, 14, 6]] * 4)
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(15):
        s_logits, t_logits, hidden = model(**batch)
        kd = distillation_loss(s_logits, t_logits, torch.zeros(4, dtype=torch.long), 2.0, 1.0)[0]
        loss = kd + hidden
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]  # logits KD across widths and the projected hidden loss both train
    assert teacher.classifier.weight.grad is None


def test_student_init_from_is_checked(lcqmc, tmp_path):
    from albert_dist.finetune.distill import build_student
    from albert_dist.model import AlbertForSequenceClassification

    with pytest.raises(Exception, match="cannot be set with init_from"):
        DistillJobConfig.model_validate({"student": {"init_from": "x", "hidden_size": 32}})
    teacher = AlbertForSequenceClassification.from_pretrained(lcqmc.model_dir)
    other = voidful_dir(tmp_path / "other", hidden=32, layers=1, seed=3)
    vocab = (other / "vocab.txt").read_text(encoding="utf-8").split("\n")
    vocab[10], vocab[11] = vocab[11], vocab[10]
    (other / "vocab.txt").write_text("\n".join(vocab), encoding="utf-8")
    cfg = DistillJobConfig.model_validate({"student": {"init_from": str(other)}})
    with pytest.raises(ConfigError, match="another vocabulary than the teacher"):
        build_student(teacher, cfg, lcqmc.model_dir)


def test_afqmc_and_tnews_configs_read_their_layouts(workspace, tmp_path):
    from albert_dist.finetune.job import prepare_task_data

    afqmc = [{"sentence1": a, "sentence2": b, "label": str(y)} for a, b, y in lcqmc_rows(20, seed=3)]
    tnews = [
        {
            "label": str(100 + i % 3),
            "label_desc": ["news_tech", "news_culture", "news_travel"][i % 3],
            "sentence": ZH_SENTENCES[i % len(ZH_SENTENCES)],
            "keywords": "",
        }
        for i in range(30)
    ]
    for name, rows in (("afqmc", afqmc), ("tnews", tnews)):
        (tmp_path / f"{name}.json").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
        )
    model = workspace / "albert_chinese_small"
    cfg = clue_config("clue_afqmc.yaml", tmp_path, [f"data.train={tmp_path / 'afqmc.json'}", "data.dev="])
    pairs = prepare_task_data(cfg.data, "classification", model)
    assert pairs.label_names == ["0", "1"]
    row = pairs.splits["train"]
    assert max(max(t) for t in row.arrays["token_type_ids"]) == 1  # sentence2 is segment B
    cfg = clue_config("clue_tnews.yaml", tmp_path, [f"data.train={tmp_path / 'tnews.json'}", "data.dev="])
    news = prepare_task_data(cfg.data, "classification", model)
    assert news.label_names == ["news_culture", "news_tech", "news_travel"]


def test_more_clue_configs_read_their_layouts(workspace, tmp_path):
    """IFLYTEK's long descriptions become windows, OCNLI's '-' pairs are left out, CSL's keyword lists are one
    text, CLUENER's spans become tags: each config on rows in its task's file layout."""
    from ner_helpers import sentences, write_cluener

    from albert_dist.finetune.job import prepare_task_data

    def write(name, rows):
        path = tmp_path / f"{name}.json"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        return path

    model = workspace / "albert_chinese_small"
    long_text = "".join(ZH_SENTENCES) * 2
    iflytek = write(
        "iflytek",
        [{"label": str(i % 2), "label_des": "社区超市" if i % 2 else "打车", "sentence": long_text} for i in range(6)],
    )
    cfg = clue_config("clue_iflytek.yaml", tmp_path, [f"data.train={iflytek}", "data.dev="])
    read = prepare_task_data(cfg.data, "classification", model).splits["train"].arrays
    assert len(read["length"]) > 2 * len(set(read["document"].tolist()))  # each long text is several windows

    labels = ["entailment", "neutral", "contradiction", "-"]
    ocnli = write(
        "ocnli",
        [
            {
                "sentence1": ZH_SENTENCES[i % 12],
                "sentence2": ZH_SENTENCES[(i + 1) % 12],
                "label": labels[i % 4],
                "genre": "news",
            }
            for i in range(40)
        ],
    )
    cfg = clue_config("clue_ocnli.yaml", tmp_path, [f"data.train={ocnli}", "data.dev=", "data.dev_fraction=0.2"])
    pairs = prepare_task_data(cfg.data, "classification", model)
    assert pairs.label_names == labels[:3] and sum(len(s) for s in pairs.splits.values()) == 30

    csl = write(
        "csl",
        [{"id": i, "abst": ZH_SENTENCES[i % 12], "keyword": ["北京", "语言"], "label": str(i % 2)} for i in range(20)],
    )
    cfg = clue_config("clue_csl.yaml", tmp_path, [f"data.train={csl}", "data.dev="])
    keyword_rows = prepare_task_data(cfg.data, "classification", model).splits["train"].arrays
    tokenizer = load_tokenizer(model)
    first = keyword_rows["input_ids"][0, : keyword_rows["length"][0]].tolist()
    assert (
        first[: first.index(tokenizer.sep_id) + 1] == tokenizer.build_inputs(tokenizer.encode("北京 语言"))["input_ids"]
    )

    cluener = write_cluener(tmp_path / "cluener.json", sentences(30, seed=4))
    cfg = clue_config("clue_cluener.yaml", tmp_path, [f"data.train={cluener}", "data.dev="])
    tagged = prepare_task_data(cfg.data, "token_classification", model)
    assert tagged.label_names[0] == "O" and {"B-PER", "I-LOC", "B-ORG"} <= set(tagged.label_names)
