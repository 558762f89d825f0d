"""Publishing a file or a directory: readers see a complete target at every moment, a failed or killed publish
leaves the target as it was, and what a killed publish left behind is removed by the next one.

Other publishers and readers are forked processes (no interpreter start, no shared GIL with the publisher)."""

from __future__ import annotations

import functools
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from albert_dist import storage
from albert_dist.errors import AlbertDistError
from albert_dist.storage import publish_dir, publish_file

NAMES = ["config.json", "model.safetensors", "tokenizer.json"]
LINES = 500
fork = multiprocessing.get_context("fork")


def write_version(path: Path, version: int, kind: str) -> None:
    """Version `version` of a file or a directory of files, written in several steps."""
    if kind == "dir":
        for name in NAMES:
            write_version(path / name, version, "file")
        return
    with open(path, "w") as f:
        for _ in range(LINES):
            f.write(f"{version}\n")


def publisher(kind: str):
    """publish_dir (its marker the directory's config.json) or publish_file."""
    return functools.partial(publish_dir, marker=NAMES[0]) if kind == "dir" else publish_file


def publish(kind: str, target: Path, version: int) -> None:
    publisher(kind)(target, lambda path: write_version(path, version, kind))


def version_of(kind: str, target: Path, dir_fd: int | None = None) -> int:
    """The version `target` holds; AssertionError or ValueError when it is incomplete. With `dir_fd`, the
    directory is read through that descriptor."""
    if kind == "file":
        return _version(target)
    names = sorted(os.listdir(target if dir_fd is None else dir_fd))
    assert names == NAMES, f"incomplete: {names}"
    versions = {_version(target / name if dir_fd is None else name, dir_fd) for name in NAMES}
    assert len(versions) == 1, f"mixed versions {versions}"
    return versions.pop()


def _version(path: Path | str, dir_fd: int | None = None) -> int:
    with open(os.open(path, os.O_RDONLY, dir_fd=dir_fd)) as f:
        text = f.read()
    version = int(text.split("\n", 1)[0])
    assert text == f"{version}\n" * LINES, "half-written"
    return version


def publish_then(kind: str, target: Path, then) -> multiprocessing.Process:
    """Another process publishing version 7 of `target` that calls `then()` once it has written it."""

    def run() -> None:
        def write(path: Path) -> None:
            write_version(path, 7, kind)
            then()

        publisher(kind)(target, write)

    process = fork.Process(target=run)
    process.start()
    return process


def own_leftovers(target: Path) -> list[str]:
    return [p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.publish.")]


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_what_a_killed_publish_left_behind_is_removed_by_the_next(tmp_path, kind):
    target = tmp_path / "target"
    publish(kind, target, 1)
    killed = publish_then(kind, target, then=lambda: os._exit(9))  # dies after writing, before the rename
    killed.join(timeout=60)
    assert killed.exitcode == 9
    assert len(own_leftovers(target)) == 1, "the killed publish left nothing to clean: the test proves nothing"
    assert version_of(kind, target) == 1
    (tmp_path / ".target.old").mkdir()  # not ours: kept
    (tmp_path / ".target.publish.notes").write_text("x")

    publish(kind, target, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".target.old", ".target.publish.notes", "target"]
    assert version_of(kind, target) == 2


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_a_publish_still_running_elsewhere_is_left_alone(tmp_path, kind):
    target = tmp_path / "target"
    written, go = fork.Event(), fork.Event()
    running = publish_then(kind, target, then=lambda: (written.set(), go.wait(60)))
    try:
        assert written.wait(60)
        publish(kind, target, 2)  # does not remove the other process's copy in the making
        assert version_of(kind, target) == 2
        go.set()
        running.join(timeout=60)
        assert running.exitcode == 0
    finally:
        running.kill()
    assert version_of(kind, target) == 7
    assert [p.name for p in tmp_path.iterdir()] == ["target"]


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_a_failing_write_keeps_the_previous_target_and_leaves_nothing(tmp_path, kind):
    target = tmp_path / "target"

    def fail(path: Path) -> None:
        write_version(path, 3, kind)
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError, match="writer failed"):
        publisher(kind)(target, fail)
    assert list(tmp_path.iterdir()) == []
    publish(kind, target, 1)
    with pytest.raises(RuntimeError, match="writer failed"):
        publisher(kind)(target, fail)
    assert [p.name for p in tmp_path.iterdir()] == ["target"]
    assert version_of(kind, target) == 1


def _poll(kind: str, target: Path, stop, found, reads, results) -> None:
    """Read `target` until `stop` is set, checking between two reads that it exists (cheap, so that even a short
    moment without it is caught); count the reads in `reads` (shared, so the writer can wait for them) and send back
    what was wrong (setting `found` at the first). A directory is opened and read through its descriptor; a read
    counts only if `target` still was that directory afterwards (a reader that opened the previous version may find
    it being deleted)."""
    problems = []
    while not stop.is_set():
        with reads.get_lock():
            reads.value += 1
        try:
            for _ in range(20):
                os.stat(target)
            if kind == "file":
                version_of(kind, target)
                continue
            fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
            try:
                try:
                    version_of(kind, target, dir_fd=fd)
                except (AssertionError, ValueError, FileNotFoundError) as err:
                    if os.stat(target).st_ino == os.fstat(fd).st_ino:
                        problems.append(f"incomplete: {err!r}")
            finally:
                os.close(fd)
        except FileNotFoundError as err:
            problems.append(f"missing: {err}")
        except (AssertionError, ValueError) as err:
            problems.append(f"half-written: {err!r}")
        if problems:
            found.set()
    results.send(problems)


def poll_while_publishing(
    kind: str, target: Path, publishes: int = 50, until_found: bool = False, min_reads: int = 20
) -> list[str]:
    """What a reader (another process) polling `target` found wrong while at least `publishes` versions were
    published (stopping at the first finding if `until_found`). Publishing starts once the reader reads and goes
    on until it has read `min_reads` times during it: on a busy machine a reader scheduled late would otherwise
    watch nothing."""
    publish(kind, target, 0)
    stop, found, reads = fork.Event(), fork.Event(), fork.Value("i", 0)
    receive, send = fork.Pipe(duplex=False)
    reader = fork.Process(target=_poll, args=(kind, target, stop, found, reads, send))
    reader.start()
    try:
        while reads.value == 0 and reader.is_alive():
            time.sleep(0.001)
        first_read, version = reads.value, 0
        while version < publishes or (reads.value - first_read < min_reads and reader.is_alive()):
            version += 1
            publish(kind, target, version)
            if until_found and found.is_set():
                break
    finally:
        stop.set()
        problems = receive.recv()
        reader.join(timeout=60)
    assert reads.value - first_read >= min_reads, "the reader hardly ran: the test proves nothing"
    assert version_of(kind, target) == version
    assert [p.name for p in target.parent.iterdir()] == [target.name]
    return problems


@pytest.fixture
def no_fsync(monkeypatch):
    """fsync only matters to a power loss, which these tests cannot cause; on a busy disk it is most of their
    time."""
    monkeypatch.setattr(storage, "_fsync", lambda path: None)


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_readers_find_a_complete_target_at_every_moment(tmp_path, kind, no_fsync):
    assert poll_while_publishing(kind, tmp_path / "target", publishes=200 if kind == "dir" else 50) == []


def test_without_renameat2_directories_are_replaced_by_renaming_aside(tmp_path, monkeypatch, no_fsync):
    """The fallback: complete copies, no leftovers, but moments without a target, which the reader above catches
    (it would against the rename-aside code this replaced)."""
    monkeypatch.setattr(storage, "_renameat2", None)
    problems = poll_while_publishing("dir", tmp_path / "target", publishes=2000, until_found=True)
    assert problems and all(p.startswith("missing") for p in problems)


def test_a_publish_replaces_only_what_a_publish_of_its_kind_made(tmp_path):
    """An output mistyped as someone's directory or file is refused before anything is written, and left as it
    was: a publish replaces its target whole. An empty directory, or one holding the marker, is replaced."""
    documents = tmp_path / "documents"
    documents.mkdir()
    (documents / "thesis.txt").write_text("years of work")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the corpus")
    for target, what in ((documents, "holds files and no config.json"), (corpus, "is a file")):
        for kind in ("dir", "uri"):
            location = f"file://{target}" if kind == "uri" else target
            with pytest.raises(AlbertDistError, match=f"refusing to publish to {location}: it {what}"):
                publish_dir(location, lambda d: write_version(d, 1, "dir"), marker="config.json")
    assert [p.name for p in documents.iterdir()] == ["thesis.txt"] and corpus.read_text() == "the corpus"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "documents"]  # no staging left either

    with pytest.raises(AlbertDistError, match=f"refusing to publish to {documents}: it is a directory"):
        publish_file(documents, lambda path: write_version(path, 1, "file"))
    assert [p.name for p in documents.iterdir()] == ["thesis.txt"]

    empty = tmp_path / "empty"
    empty.mkdir()
    publish("dir", empty, 1)
    publish("dir", empty, 2)  # holds config.json: an earlier publish's
    assert version_of("dir", empty) == 2


def test_an_upload_cut_off_is_replaced_by_the_next(tmp_path):
    """An upload to a URI that died half-way left objects and no marker, but its UPLOADING object: the next
    publish replaces them (file://, the same code as s3://)."""
    target = tmp_path / "bucket" / "model"
    target.mkdir(parents=True)
    (target / "model.safetensors").write_text("half an old upload")
    (target / storage.UPLOADING).write_text("")
    stage = tmp_path / "stage"
    stage.mkdir()
    write_version(stage, 3, "dir")
    storage.upload_dir(stage, f"file://{target}", last="config.json")
    assert version_of("dir", target) == 3  # every file the new one's, UPLOADING gone
