"""`albert-dist export`: a trained model directory to a directory onnxruntime serves from.

It holds `model.onnx` (fp32, int8 or fp16; batch and sequence axes dynamic), `config.json` naming the head the graph
holds (`albert_dist.model.onnx_runtime.OnnxModel` reads both), the model's tokenizer files, and `export.json`: what
was exported and how, the check against PyTorch (check.py), the sizes, and with `--dev` the dev-set metrics of
the export beside PyTorch fp32's. The directory is published atomically, once the check passed: a failed export
leaves what was at `--output` as it was.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from albert_dist.errors import CheckpointError, ConfigError
from albert_dist.export import check, convert
from albert_dist.export.dev_metrics import DevSet, dev_metrics, load_dev, log_to_source_run
from albert_dist.hub import card
from albert_dist.model.checkpoint import CONFIG_NAME, SAFE_WEIGHTS_NAME, load_config
from albert_dist.model.onnx_runtime import INPUT_NAMES, MODEL_FILE, ONNX_HEADS, OnnxModel, exported_architecture
from albert_dist.storage import publishing_dir
from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

EXPORT_JSON = "export.json"
FORMATS = ("onnx",)
QUANTIZATIONS = ("none", "int8", "fp16")
# What transformers' and our tokenizers read from a model directory; those present travel with the export.
TOKENIZER_FILES = (
    "spiece.model",
    "spiece.vocab",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
)


def run_export(
    model_dir: str | Path,
    output: str | Path,
    *,
    fmt: str = "onnx",
    quantize: str = "none",
    opset: int = convert.DEFAULT_OPSET,
    dev: DevSet | None = None,
    tracking_uri: str | None = None,
) -> dict:
    """Export `model_dir` to `output`; returns export.json's content."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: albert-dist exports {', '.join(FORMATS)}")
    if quantize not in QUANTIZATIONS:
        raise ConfigError(f"--quantize {quantize!r}: choose one of {', '.join(QUANTIZATIONS)}")
    convert.check_opset(opset)
    model_dir = Path(model_dir)
    config = load_config(model_dir)
    architecture = exported_architecture(config, model_dir)
    tokenizer = load_tokenizer(model_dir)
    dev_rows = load_dev(dev, model_dir, architecture, config, tokenizer) if dev else None
    head = ONNX_HEADS[architecture]
    model = head.model_class.from_pretrained(model_dir)
    outputs = convert.exported_outputs(model, head.outputs, convert.sample_inputs(config, 2, 8, seed=0))
    precision = "fp32" if quantize == "none" else quantize
    with publishing_dir(output, marker=EXPORT_JSON, error=CheckpointError) as staging:
        build = staging / ".build"
        build.mkdir()
        fp32 = build / "fp32.onnx"
        convert.to_onnx(model, outputs, fp32, opset)
        if quantize == "int8":
            convert.to_int8(fp32, staging / MODEL_FILE, config)
        elif quantize == "fp16":
            convert.to_fp16(fp32, staging / MODEL_FILE)
        else:
            shutil.copyfile(fp32, staging / MODEL_FILE)
        sizes = {"model.onnx": (staging / MODEL_FILE).stat().st_size, "fp32_onnx": fp32.stat().st_size}
        shutil.rmtree(build)
        if (model_dir / SAFE_WEIGHTS_NAME).is_file():
            sizes["pytorch_weights"] = (model_dir / SAFE_WEIGHTS_NAME).stat().st_size
        dataclasses.replace(model.config, architectures=[architecture]).to_json_file(staging / CONFIG_NAME)
        for name in TOKENIZER_FILES:
            if (model_dir / name).is_file():
                shutil.copyfile(model_dir / name, staging / name)
        tokenizer.save_fast(staging)  # tokenizer.json, also for a source made before albert-dist wrote it
        onnx_model = OnnxModel(staging)
        checked = check.compare(model, onnx_model, check.TOLERANCES[quantize])
        metadata = _metadata(model_dir, config, architecture, quantize, opset, outputs, checked, sizes)
        if dev_rows is not None:
            metadata["dev"] = dev_metrics(dev_rows, model, onnx_model, precision)
            metadata["mlflow"] = log_to_source_run(
                model_dir, {k: v for k, v in metadata["dev"].items() if isinstance(v, dict)}, tracking_uri
            )
        (staging / EXPORT_JSON).write_text(json.dumps(metadata, indent=2, ensure_ascii=False) + "\n")
        (staging / card.CARD_NAME).write_text(export_card(model_dir, staging, metadata, tokenizer), encoding="utf-8")
    print(summary(metadata, output))
    return metadata


def export_card(model_dir: Path, staging: Path, metadata: dict, tokenizer) -> str:
    """The export's model card: what was exported and how it checked out against PyTorch, its dev metrics, then the
    source model's own card (its data, config, metrics and MLflow run) when it has one."""
    from albert_dist.finetune.job import source_run_id
    from albert_dist.tokenizer.albert_tokenizer import languages

    precision = "fp32" if metadata["quantization"] == "none" else metadata["quantization"]
    checked = metadata["check"]["outputs"]
    export = [
        "## The export",
        "",
        f"`model.onnx`: ONNX opset {metadata['opset']}, {precision}, batch and sequence axes dynamic, from "
        f"`{metadata['source']['model']}`. Checked against PyTorch on the same inputs:",
        "",
        *(f"- {name}: max abs diff {m['max_abs_diff']:.2g} (bound {m['bound']:.2g})" for name, m in checked.items()),
    ]
    source_card = model_dir / card.CARD_NAME
    if source_card.is_file():
        # without its front matter and its loading snippets, which are the PyTorch model's
        body = source_card.read_text(encoding="utf-8").split("\n---\n", 1)[-1].split("\n## How to load it")[0]
        export += ["", "## The source model", "", ("\n" + body.strip()).replace("\n#", "\n##").strip()]
    run_id = (metadata.get("mlflow") or {}).get("run_id") or source_run_id(model_dir)
    dev = metadata.get("dev", {}).get(f"onnx_{precision}", {})
    facts = card.CardFacts(
        title=f"{model_dir.name} as ONNX ({precision})",
        task="export",
        architecture=metadata["architecture"],
        languages=languages(tokenizer),
        model_config=json.loads((staging / CONFIG_NAME).read_text()),
        metrics={f"dev_{name}": value for name, value in dev.items()},
        mlflow={"run_id": run_id} if run_id else {},
        extra_tags=["onnx", precision],
        extra_sections=export,
    )
    return card.render(facts)


def _metadata(model_dir, config, architecture, quantize, opset, outputs, checked, sizes) -> dict:
    import onnx
    import onnxruntime
    import torch

    metadata = {
        "format": "onnx",
        "quantization": quantize,
        "opset": opset,
        "architecture": architecture,
        "source": {"model": str(model_dir), "architecture": (config.architectures or [architecture])[0]},
        "inputs": list(INPUT_NAMES),
        "outputs": list(outputs),
        "dynamic_axes": {"batch": 0, "sequence": 1},
        "max_sequence_length": config.max_position_embeddings,
        "check": checked,
        "sizes": sizes,
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__},
    }
    if quantize == "int8":
        metadata["int8"] = {
            "method": "onnxruntime.quantization.quantize_dynamic after onnxruntime.transformers fusions",
            "operators": list(convert.INT8_OPERATORS),
            "weights": "int8, per channel" if convert.INT8_PER_CHANNEL else "int8, per tensor",
            "activations": "uint8, quantized per batch at run time",
        }
    return metadata


def summary(metadata: dict, output: str | Path) -> str:
    """What an export's export.json says, in a few lines for the console."""
    sizes, checked = metadata["sizes"], metadata["check"]
    precision = "fp32" if metadata["quantization"] == "none" else metadata["quantization"]
    lines = [
        f"exported {metadata['architecture']} as ONNX ({precision}, opset {metadata['opset']}) to {output}: "
        f"model.onnx {sizes['model.onnx'] / 1e6:.1f} MB"
        + (f" (fp32 {sizes['fp32_onnx'] / 1e6:.1f} MB)" if precision != "fp32" else "")
    ]
    for name, m in checked["outputs"].items():
        agreement = m.get("argmax_agreement")
        lines.append(
            f"  {name}: max abs diff {m['max_abs_diff']:.2g} against PyTorch (bound {m['bound']:.2g})"
            + (f", argmax agreement {agreement:.1%}" if agreement is not None else "")
        )
    if "dev" in metadata:
        dev = metadata["dev"]
        exported, reference = dev[f"onnx_{precision}"], dev["pytorch_fp32"]
        scores = ", ".join(f"{k} {exported[k]:.4f} (PyTorch fp32 {reference[k]:.4f})" for k in exported)
        lines.append(f"  dev ({dev['rows']} rows of {dev['file']}): {scores}")
        mlflow = metadata["mlflow"]
        lines.append(
            f"  logged to MLflow run {mlflow['run_id']}"
            if mlflow["logged"]
            else f"  not logged to MLflow: {mlflow['reason']}"
        )
    return "\n".join(lines)
