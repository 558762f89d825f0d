"""A disk that fills up while checkpoints, the best model or prepared data are written: a clear error naming the
path, and what was there before intact (no half-written file left behind). The disk is a real 2 MB tmpfs; a
read-only one refuses a run directory with one line."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from process_helpers import fault_unavailable
from safetensors.torch import load_file
from test_data_support import english_tokenizer  # noqa: F401 - fixture
from test_loop import Checkpoints, KeywordTask, settings

from albert_dist.errors import AlbertDistError, CheckpointError, DataError
from albert_dist.model import AlbertConfig, AlbertForSequenceClassification
from albert_dist.model.checkpoint import CONFIG_NAME
from albert_dist.storage import publish_dir
from albert_dist.train import checkpointing
from albert_dist.train.loop import Trainer, WorkerEnv


@contextlib.contextmanager
def tmpfs(directory: Path, size: str, *options: str) -> Iterator[Path]:
    """A real tmpfs of `size` (mount's syntax: "2m") mounted at `directory` for the block, with mount `options`."""
    directory.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        fault_unavailable(f"cannot mount a tmpfs to fill up (needs root): {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


def test_a_run_directory_on_a_read_only_mount_is_one_line_naming_it(tmp_path):
    """The OS refusing a path of the user's (a read-only mount here; no permission for a user who is not root) is
    the user's error: one line naming the path, from the CLI (a Ray job's entry point too), no traceback."""
    with tmpfs(tmp_path / "ro", "1m", "ro") as read_only:
        result = subprocess.run(
            [sys.executable, "-m", "albert_dist.cli", "pretrain", "--set", f"run.output_dir={read_only / 'runs'}"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
            timeout=300,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [
            f"albert-dist: error: {read_only / 'runs'}: Read-only file system (a path the config names, or one under it)"
        ]


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "2m") as disk:
        yield disk


def fill(disk: Path, leave: int = 0) -> None:
    """Take all of the disk's free space but `leave` bytes."""
    stat = os.statvfs(disk)
    ballast = stat.f_bavail * stat.f_frsize - leave
    with open(disk / "ballast", "wb") as f:
        try:
            f.write(b"\0" * ballast)
        except OSError:  # the last page did not fit
            pass


def tiny_classifier(seed: int) -> AlbertForSequenceClassification:
    torch.manual_seed(seed)
    return AlbertForSequenceClassification(
        AlbertConfig(
            vocab_size=60,
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=48,
        )
    )


def assert_same_weights(directory: Path, expected: dict[str, torch.Tensor]) -> None:
    found = load_file(directory / "model.safetensors")
    assert found.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(found[key], expected[key], rtol=0, atol=0, msg=key)


def test_model_written_to_a_full_disk_fails_clearly_and_keeps_the_previous_one(small_disk):
    target = small_disk / "best"
    publish_dir(target, tiny_classifier(0).save_pretrained, marker=CONFIG_NAME)
    before = load_file(target / "model.safetensors")
    fill(small_disk)
    newer = tiny_classifier(1)
    with pytest.raises(AlbertDistError, match=f"no space left on device while writing {target}"):
        publish_dir(target, newer.save_pretrained, marker=CONFIG_NAME)  # the way the best model is replaced
    with pytest.raises(CheckpointError, match=f"no space left on device while writing {target}/model.safetensors"):
        newer.save_pretrained(target)  # in place: file by file, each atomically
    assert sorted(p.name for p in small_disk.iterdir()) == ["ballast", "best"]
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert_same_weights(target, before)
    AlbertForSequenceClassification.from_pretrained(target)


def test_training_on_a_full_disk_stops_clearly_and_keeps_checkpoints_and_best_model(small_disk, tmp_path, monkeypatch):
    """Checkpoints are staged in the temp dir and the best model lives on the small disk. The disk fills up once
    step 8's evaluation is logged: after the best model of step 8 was kept, before that step's checkpoint is staged,
    so the checkpoint is the write that meets the full disk."""
    monkeypatch.setattr(tempfile, "tempdir", str(small_disk / "tmp"))
    (small_disk / "tmp").mkdir()
    saved = Checkpoints(tmp_path / "reported")
    saved.root.mkdir()
    best_when_full = {}

    def fill_after_the_last_evaluation(metrics, step):
        if step == 8 and any(name.startswith("eval_") for name in metrics):
            fill(small_disk)
            best_when_full.update(load_file(small_disk / "model" / "model.safetensors"))

    env = WorkerEnv(
        report=saved, publish_to=small_disk, log_metrics=fill_after_the_last_evaluation, print_fn=lambda line: None
    )
    trainer = Trainer(KeywordTask(), settings(max_steps=8, log_every=2, eval_every=4, checkpoint_every=4), env)
    with pytest.raises(
        AlbertDistError,
        match=r"^no space left on device while writing the checkpoint of step 8 "
        f"\\({small_disk}/tmp/albert-ckpt-",
    ):
        trainer.fit()
    assert best_when_full, "the disk was never filled"
    assert [r["step"] for r in saved.reports] == [4]
    checkpointing.load_training_state(saved.root / "step4")  # verified and loadable
    assert sorted(p.name for p in small_disk.iterdir()) == ["ballast", "model", "tmp"]
    assert not list((small_disk / "tmp").glob("albert-ckpt-*")), "a half-written checkpoint was left behind"
    assert_same_weights(small_disk / "model", best_when_full)
    AlbertForSequenceClassification.from_pretrained(small_disk / "model")


def test_prepared_data_on_a_full_disk_fails_clearly_and_keeps_the_earlier_dataset(
    small_disk,
    tmp_path,
    english_tokenizer,  # noqa: F811
    stdlib_corpus,
    ray_session,
):
    from albert_dist.data.config import DataJobConfig
    from albert_dist.data.loading import load_prepared
    from albert_dist.data.prepare import prepare_dataset

    corpus = tmp_path / "small.txt"
    corpus.write_text(stdlib_corpus.read_text()[:60_000])
    tokenizer_dir = english_tokenizer.save(tmp_path / "tokenizer")
    cfg = DataJobConfig.model_validate(
        {
            "run": {"output_dir": str(small_disk)},
            "data": {
                "inputs": [str(corpus)],
                "format": "blocks",
                "output": "prepared",
                "max_seq_length": 64,
                "eval_fraction": 0.1,
                "tokenizer_actors": 1,
            },
            "tokenizer": {"path": str(tokenizer_dir)},
        }
    )
    prepare_dataset(cfg, log=lambda _: None)
    location = small_disk / "prepared"
    before = {p.relative_to(location): p.read_bytes() for p in location.rglob("*") if p.is_file()}

    # Room for the tokenizer's files (in 4 KiB pages) and one more page: not for the shards.
    fill(small_disk, leave=sum(-(-p.stat().st_size // 4096) * 4096 for p in tokenizer_dir.iterdir()) + 4096)
    with pytest.raises(DataError, match=f"no space left on device while writing the prepared data for {location}"):
        prepare_dataset(cfg, log=lambda _: None)
    assert sorted(p.name for p in small_disk.iterdir()) == ["ballast", "prepared"]
    assert {p.relative_to(location): p.read_bytes() for p in location.rglob("*") if p.is_file()} == before
    assert load_prepared(location).train is not None
