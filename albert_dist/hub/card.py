"""The model card (`README.md`) of every model albert-dist publishes: Hub metadata (language, tags, pipeline_tag,
base_model; no license, which albert-dist cannot know) as front matter, then the task, the data (source and digest),
the config, the metrics, the MLflow run and how to load the model with transformers and with albert-dist.

Snippets name the model `MODEL_PLACEHOLDER`: `albert-dist push` writes the repo id there, a local copy reads it as
the directory's path."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from albert_dist.redaction import redact_url

CARD_NAME = "README.md"
MODEL_PLACEHOLDER = "path/to/this/model"

# transformers' pipeline task of each architecture, the Hub's `pipeline_tag`
PIPELINE_TAGS = {
    "AlbertForPreTraining": "fill-mask",
    "AlbertForMaskedLM": "fill-mask",
    "AlbertModel": "feature-extraction",
    "AlbertForSequenceClassification": "text-classification",
    "AlbertForTokenClassification": "token-classification",
    "AlbertForQuestionAnswering": "question-answering",
}


@dataclass
class CardFacts:
    """What a card says, as plain values."""

    title: str
    task: str  # what made the model: "pretrain", "finetune", "distill", "export"
    architecture: str
    languages: list[str]
    model_config: dict[str, Any]  # config.json
    data: dict[str, Any] = field(default_factory=dict)  # where the data came from and its digest
    metrics: dict[str, float] = field(default_factory=dict)
    mlflow: dict[str, str] = field(default_factory=dict)  # run_id, tracking_uri, experiment
    base_model: str | None = None  # a hub id the model started from
    job_config: str | None = None  # the job's validated config, as YAML
    extra_tags: list[str] = field(default_factory=list)
    extra_sections: list[str] = field(default_factory=list)  # markdown sections of their own (an export's)


def render(facts: CardFacts) -> str:
    """The card as text: YAML front matter (huggingface_hub's ModelCardData) and markdown."""
    from huggingface_hub import ModelCardData

    pipeline_tag = PIPELINE_TAGS.get(facts.architecture)
    metadata = ModelCardData(
        language=facts.languages,
        library_name="transformers",
        tags=["albert", "albert-dist", facts.task, *facts.extra_tags],
        pipeline_tag=pipeline_tag,
        base_model=facts.base_model,
    )
    c = facts.model_config
    shape = {
        key: c[key]
        for key in (
            "vocab_size",
            "embedding_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "num_labels",
        )
        if key in c
    }
    lines = [
        "---",
        metadata.to_yaml(),
        "---",
        "",
        f"# {facts.title}",
        "",
        f"An ALBERT model ({facts.architecture}, pipeline `{pipeline_tag or 'none'}`) made by "
        f"`albert-dist {facts.task}`"
        + (
            f", starting from [{facts.base_model}](https://huggingface.co/{facts.base_model})"
            if facts.base_model
            else ""
        )
        + ".",
        *(["", *facts.extra_sections] if facts.extra_sections else []),
        *(["", "## Data", ""] if facts.data else []),  # an export's is its source card's
        *(f"- {key}: `{_inline(value)}`" for key, value in facts.data.items()),
        "",
        "## Config",
        "",
        "| field | value |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in shape.items()),
    ]
    if "id2label" in c:
        lines += ["", f"Labels: {', '.join(str(c['id2label'][k]) for k in sorted(c['id2label'], key=int))}"]
    if facts.job_config:
        lines += [
            "",
            "<details><summary>The job's config</summary>",
            "",
            "```yaml",
            redact_url(facts.job_config).strip(),
            "```",
        ]
        lines += ["", "</details>"]
    lines += ["", "## Metrics", ""]
    if facts.metrics:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {name} | {_number(value)} |" for name, value in sorted(facts.metrics.items())]
    else:
        lines.append("None recorded.")
    lines += ["", "## Lineage", ""]
    if facts.mlflow.get("run_id"):
        lines.append(f"- MLflow run: `{facts.mlflow['run_id']}`")
        for key in ("experiment", "tracking_uri"):
            if facts.mlflow.get(key):
                lines.append(f"- MLflow {key.replace('_', ' ')}: `{redact_url(str(facts.mlflow[key]))}`")
    else:
        lines.append("- MLflow run: not recorded")
    if facts.base_model:
        lines.append(f"- base model: `{facts.base_model}`")
    lines += ["", "## How to load it", "", *_how_to_load(facts.architecture, facts.task)]
    return "\n".join(lines) + "\n"


def _how_to_load(architecture: str, task: str) -> list[str]:
    if task == "export":
        return [
            "With albert-dist (onnxruntime; the tokenizer through transformers' AutoTokenizer or ours):",
            "",
            "```bash",
            f"albert-dist predict --model {MODEL_PLACEHOLDER} --backend onnx --input texts.jsonl "
            "--output predictions.jsonl",
            "```",
        ]
    return [
        "With transformers (its `tokenizer.json` loads the fast tokenizer as albert-dist encodes):",
        "",
        "```python",
        f"from transformers import AutoTokenizer, {architecture}",
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{MODEL_PLACEHOLDER}")',
        f'model = {architecture}.from_pretrained("{MODEL_PLACEHOLDER}")',
        "```",
        "",
        "With albert-dist (a hub id or a directory):",
        "",
        "```bash",
        *(
            [f"albert-dist predict --model {MODEL_PLACEHOLDER} --input texts.jsonl --output predictions.jsonl"]
            if architecture != "AlbertForPreTraining"
            else [f"albert-dist finetune --config finetune --set model.init_from={MODEL_PLACEHOLDER}"]
        ),
        "```",
    ]


def _inline(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return redact_url(text).replace("`", "'")


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)
