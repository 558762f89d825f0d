"""Read and write checkpoint directories in transformers' layout: config.json + model.safetensors.

Any transformers ALBERT directory loads (pretraining, masked LM, base model, classification), and what we write
loads in transformers. A directory may be a Hugging Face Hub id (`org/name[@revision]`, albert_dist.hub.download).
Weights are never unpickled freely: a directory with only pytorch_model.bin (as the albert_chinese_* checkpoints
ship) is read once with torch.load(weights_only=True), which accepts tensors and plain containers only, and
converted to safetensors in this host's cache (keyed by the pickle's sha256); every later load reads that.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from albert_dist.errors import AlbertDistError, CheckpointError
from albert_dist.hub.download import local_dir
from albert_dist.model.config import AlbertConfig
from albert_dist.storage import cache_root, publish_file, sha256_file

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
PICKLE_WEIGHTS_NAME = "pytorch_model.bin"

BACKBONE_PREFIX = "albert."
# Entries older transformers versions stored that we rebuild instead: the decoder tied to the word embeddings and
# to predictions.bias, and non-persistent buffers.
DERIVED_KEY_SUFFIXES = (
    "predictions.decoder.weight",
    "predictions.decoder.bias",
    "embeddings.position_ids",
    "embeddings.token_type_ids",
)
# Heads of the other ALBERT classes: dropping them (e.g. pretraining heads when fine-tuning) is routine.
KNOWN_HEAD_PREFIXES = ("predictions.", "sop_classifier.", "classifier.", "qa_outputs.", "pooler.", "albert.pooler.")


def save_pretrained(model, directory: str | os.PathLike) -> None:
    """Write config.json and model.safetensors into `directory`, leaving its other files (tokenizer) alone."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    config = dataclasses.replace(model.config, architectures=[model.architecture])
    # Weights first: a crash in between leaves the previous config beside new weights of the same shapes.
    publish_file(
        directory / SAFE_WEIGHTS_NAME,
        lambda p: save_file(state, str(p), metadata={"format": "pt"}),
        error=CheckpointError,
    )
    publish_file(directory / CONFIG_NAME, config.to_json_file, error=CheckpointError)


def load_config(directory: str | os.PathLike, **overrides) -> AlbertConfig:
    directory = local_dir(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(f"checkpoint directory {directory} has no {CONFIG_NAME}")
    try:
        return AlbertConfig.from_json_file(path, **overrides)
    except (OSError, json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    except AlbertDistError as e:
        raise CheckpointError(f"{path}: {e}") from e


def load_state_dict(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of model.safetensors (or its shards), else of pytorch_model.bin through its safetensors copy."""
    directory = local_dir(directory)
    safe, index, pickled = (
        directory / SAFE_WEIGHTS_NAME,
        directory / SAFE_WEIGHTS_INDEX_NAME,
        directory / PICKLE_WEIGHTS_NAME,
    )
    try:
        if safe.is_file():
            return load_file(str(safe))
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return {k: v for shard in shards for k, v in load_file(str(directory / shard)).items()}
        if pickled.is_file():
            return load_file(str(converted(pickled)))
    except (OSError, SafetensorError, json.JSONDecodeError, KeyError, RuntimeError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"cannot read the weights in {directory}: {e}") from e
    raise CheckpointError(f"checkpoint directory {directory} has neither {SAFE_WEIGHTS_NAME} nor {PICKLE_WEIGHTS_NAME}")


def converted(pickled: Path) -> Path:
    """The safetensors copy of the pickled state dict `pickled`, made on first use: torch.load(weights_only=True)
    refuses anything but tensors and plain containers (a pickle from elsewhere cannot run code), and the copy
    spares every later load (each worker, each run) the unpickling."""
    target = cache_root() / "safetensors" / f"{sha256_file(pickled)}.safetensors"
    if target.is_file():
        return target
    state = torch.load(pickled, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{pickled} is not a state dict of tensors")
    seen: set[int] = set()
    tensors = {}
    for key, tensor in state.items():
        # safetensors stores no shared memory: older checkpoints tie the decoder to the word embeddings
        shared = tensor.untyped_storage().data_ptr() in seen
        seen.add(tensor.untyped_storage().data_ptr())
        tensors[key] = tensor.clone().contiguous() if shared else tensor.contiguous()
    target.parent.mkdir(parents=True, exist_ok=True)
    publish_file(target, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}), error=CheckpointError)
    logger.info("%s converted to safetensors: %s", pickled, target)
    return target


def _adapt_keys(model, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a checkpoint's keys onto `model`: add or strip the `albert.` prefix, drop derived entries."""
    if "predictions.bias" not in state and "predictions.decoder.bias" in state:
        state["predictions.bias"] = state["predictions.decoder.bias"]
    state = {k: v for k, v in state.items() if not k.endswith(DERIVED_KEY_SUFFIXES)}
    has_prefix = any(k.startswith(BACKBONE_PREFIX) for k in state)
    if hasattr(model, "albert") and not has_prefix:  # a base AlbertModel checkpoint into a model with heads
        return {BACKBONE_PREFIX + k: v for k, v in state.items()}
    if not hasattr(model, "albert") and has_prefix:  # a checkpoint with heads into the base model
        return {(k[len(BACKBONE_PREFIX) :] if k.startswith(BACKBONE_PREFIX) else k): v for k, v in state.items()}
    return state


def load_weights(model, state: dict[str, torch.Tensor], source: str | os.PathLike) -> None:
    """Copy `state` into `model`. Missing heads (and pooler) stay freshly initialised, with a warning; a missing
    backbone weight or a shape that disagrees with the config is a CheckpointError."""
    state = _adapt_keys(model, dict(state))
    expected = model.state_dict()
    for key, tensor in state.items():
        if key in expected and tensor.shape != expected[key].shape:
            raise CheckpointError(
                f"{source}: {key} has shape {tuple(tensor.shape)} in the checkpoint but "
                f"{tuple(expected[key].shape)} in the model built from its config"
            )
    missing, unexpected = model.load_state_dict(state, strict=False)
    optional = model.head_prefixes + ("pooler.", BACKBONE_PREFIX + "pooler.")
    broken = [k for k in missing if not k.startswith(optional)]
    if broken:
        raise CheckpointError(
            f"{source}: the checkpoint lacks {len(broken)} backbone weights of "
            f"{type(model).__name__} (e.g. {', '.join(broken[:3])}); is it an ALBERT checkpoint?"
        )
    if missing:
        logger.warning("%s: not in the checkpoint, newly initialised: %s", source, ", ".join(missing))
    dropped_heads = [k for k in unexpected if k.startswith(KNOWN_HEAD_PREFIXES)]
    if dropped_heads:
        logger.info("%s: heads not used by %s: %s", source, type(model).__name__, ", ".join(dropped_heads))
    strange = [k for k in unexpected if k not in dropped_heads]
    if strange:
        logger.warning("%s: ignored weights unknown to %s: %s", source, type(model).__name__, ", ".join(strange))


def from_pretrained(cls, directory: str | os.PathLike, **config_overrides):
    """Build `cls` from config.json (plus overrides such as num_labels) and load the weights; eval mode."""
    directory = local_dir(directory)
    config = load_config(directory, **config_overrides)
    state = load_state_dict(directory)
    model = cls(config)
    load_weights(model, state, directory)
    return model.eval()
