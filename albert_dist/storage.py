"""The storage layer: local paths and `s3://`/`gs://` URIs (resolve, join, filesystem, staging), checksums, and
publishing a file or a directory so that readers see the old or the new one, complete, at every moment; the same for
locations in object storage (`s3://`, `gs://`, through pyarrow's filesystems), and reading them back.

A publish writes a temporary copy beside its target, named `.TARGET.publish.HOST.PID.UUID`, then renames it over
the target. A directory replaces only what a publish of its kind made (`check_replaceable`): a mistyped output
naming the corpus, or someone's documents, is refused instead of deleted. Each publish first removes the copies
earlier publishes of the same target left behind when their process died (this host, a pid no longer running);
copies of publishes still running are left alone.

Files are fsynced before the rename, so after a power loss the target holds the old or the new content, complete
(directories are not: the rename itself may be lost, leaving the old version).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from albert_dist.errors import AlbertDistError, CheckpointError, ConfigError, DataError, StorageError, disk_full_errors

#: written last into a directory published to a URI (`publishing_dir`): its files and their sha256
PUBLISHED = "published.json"
_HOST = socket.gethostname()
_IN_FLIGHT: set[str] = set()  # this process's temporary copies still being written (other threads' included)
_IN_FLIGHT_LOCK = threading.Lock()


def resolve_path(path: str | Path, base: str | Path | None = None) -> Path:
    """Absolute form of a local `path`; relative paths sit under `base`, else $ALBERT_DIST_HOME, else the current
    directory. A URI is refused (`Path("s3://b/x")` would be the local `s3:/b/x`): see `resolve_location`.

    Ray jobs run in a temporary copy of the working directory, so outputs must never stay relative to it.
    """
    if is_uri(path):
        raise ConfigError(f"{path} is a URI where a local or mounted path is needed")
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    root = Path(base) if base is not None else Path(os.environ.get("ALBERT_DIST_HOME", os.getcwd()))
    return (root / p).resolve()


def resolve_location(path: str, base: str | Path | None = None) -> str:
    """`resolve_path` for places pyarrow's filesystems reach (`filesystem`): URIs
    (`s3://...`, `gs://...`, `file://...`) unchanged, local paths absolute."""
    return path if is_uri(path) else str(resolve_path(path, base))


def is_uri(path: str | Path) -> bool:
    return "://" in str(path)


def join_location(base: str | Path, *parts: str) -> Path | str:
    """`base/part/...`: a Path for a local `base`; for a URI, its path extended (`s3://b/x?region=r` and `y`:
    `s3://b/x/y?region=r`)."""
    if not is_uri(base):
        return Path(base).joinpath(*parts)
    split = urllib.parse.urlsplit(str(base))
    return urllib.parse.urlunsplit(split._replace(path="/".join([split.path.rstrip("/"), *parts])))


def staging_dir(location: str) -> Path:
    """The local directory of a URI `location` (a run's, a model's, a checkpoint's): its staging and download
    cache, `$ALBERT_DIST_STAGING/<scheme>/<bucket>/<key>`, by default under `$XDG_CACHE_HOME/albert-dist` (else
    ~/.cache/albert-dist). The same on every launch on a host: a relaunch finds its lock and downloads there."""
    root = os.environ.get("ALBERT_DIST_STAGING") or cache_root()
    return Path(root, urllib.parse.urlsplit(location).scheme, *uri_path(location).strip("/").split("/"))


def cache_root() -> Path:
    """This host's cache of albert-dist: `$XDG_CACHE_HOME/albert-dist`, else ~/.cache/albert-dist."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "albert-dist"


def uri_path(uri: str) -> str:
    """The bucket and key of `uri` (`bucket/prefix` of `s3://bucket/prefix?region=x`)."""
    parts = urllib.parse.urlsplit(uri)
    return parts.netloc.rpartition("@")[2] + parts.path


def filesystem(location: str):
    """The pyarrow filesystem and in-filesystem path of a local path or a URI (s3://, gs://, hdfs://, file://).
    An S3 filesystem retries its requests through the store's transient faults (`retrying_s3`)."""
    import pyarrow.fs  # pyarrow loads in a second: only code that reads or writes pays for it

    if "://" in location:
        try:
            fs, path = pyarrow.fs.FileSystem.from_uri(location)
        except Exception as err:  # noqa: BLE001 - pyarrow raises several types for bad or unsupported URIs
            raise DataError(f"cannot open {location}: {err}") from None
        return (retrying_s3(fs) if fs.type_name == "s3" else fs), path
    return pyarrow.fs.LocalFileSystem(), str(Path(location).expanduser().resolve())


#: the environment variable that sets how long (seconds) an object-store request is retried, at least
RETRY_ENV = "ALBERT_DIST_STORAGE_RETRY_S"
#: its default: a store throttling or refusing every request for a minute or more (a failover, a throttled
#: prefix) is ridden out; a store gone for good fails the run within a few minutes
DEFAULT_RETRY_S = 100.0
_FIRST_DELAY_S = 0.025  # the AWS SDK's default strategy: 25 ms × (2^n − 2) of waits in all over n attempts


def retry_budget() -> float:
    """How long an object-store request is retried at least (`RETRY_ENV`, else `DEFAULT_RETRY_S`)."""
    value = os.environ.get(RETRY_ENV, "")
    try:
        budget = float(value) if value else DEFAULT_RETRY_S
    except ValueError:
        raise ConfigError(f"{RETRY_ENV}={value!r}: seconds expected (a number)") from None
    if not budget >= 0:
        raise ConfigError(f"{RETRY_ENV}={value!r}: seconds expected (zero or more)")
    return budget


def retry_attempts(budget: float) -> int:
    """The fewest attempts whose backoff (the AWS SDK's default strategy, doubling) waits `budget` seconds at
    least in all; the waits then add up to less than twice `budget` (the last one is half of them)."""
    attempts = 1
    while _FIRST_DELAY_S * (2**attempts - 2) < budget:
        attempts += 1
    return attempts


def retrying_s3(fs):
    """`fs` (a pyarrow S3FileSystem) retrying each request through 503 SlowDown, connection resets and timeouts
    for `retry_budget()` seconds at least, with exponential backoff; an access refused (403) is not retried.
    The S3 client's own default gives up on a refusing store within seconds: one throttled minute would fail
    the run."""
    return _retrying_s3(fs.__reduce__()[1][0], retry_attempts(retry_budget()))


def _retrying_s3(settings: dict, attempts: int):
    """An S3 filesystem of pyarrow's `settings` retrying `attempts` times; also how a pickled one is rebuilt."""
    import pyarrow.fs

    fs = _retrying_s3_class()(**settings, retry_strategy=pyarrow.fs.AwsDefaultS3RetryStrategy(max_attempts=attempts))
    fs.attempts = attempts
    return fs


@functools.cache
def _retrying_s3_class():
    import pyarrow.fs

    class RetryingS3FileSystem(pyarrow.fs.S3FileSystem):
        """Keeps its retry strategy when pickled (Ray Train's controller and workers, Ray Data's read tasks get
        copies), which pyarrow's own pickling drops."""

        def __reduce__(self):
            return _retrying_s3, (super().__reduce__()[1][0], self.attempts)

    return RetryingS3FileSystem


def object_store_error(err: BaseException, location: str | Path) -> StorageError | None:
    """The one line for an object-store request on `location` that failed for good (pyarrow's S3 error, after
    `retrying_s3`'s retries or at once for a refused access); None for any other error."""
    text = str(err)
    if not isinstance(err, OSError) or isinstance(err, StorageError) or "AWS Error" not in text:
        return None
    if "ACCESS_DENIED" in text or "HTTP status 403" in text:
        return StorageError(
            f"the object store refused access to {location}: {text} (check the credentials and "
            f"their permissions on the bucket)"
        )
    return StorageError(
        f"the object store failed a request on {location} after retrying for {retry_budget():.0f} "
        f"s at least ({RETRY_ENV}): {text}"
    )


@contextlib.contextmanager
def object_store_errors(location: str | Path) -> Iterator[None]:
    """Report an object-store request that failed for good as one `StorageError` naming `location`."""
    try:
        yield
    except OSError as err:
        error = object_store_error(err, location)
        if error is None:
            raise
        raise error from err


def sha256_file(path: str | Path) -> str:
    """The file's sha256, read in 1 MiB blocks (checkpoints and tokenizers are too big to read at once)."""
    with open(path, "rb") as f:
        return sha256_stream(f)


def sha256_stream(stream: BinaryIO) -> str:
    """The sha256 of what is left to read in `stream` (a local file or a pyarrow stream of a remote one)."""
    digest = hashlib.sha256()
    for block in iter(lambda: stream.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def publish_file(
    path: str | Path, write: Callable[[Path], object], *, error: type[AlbertDistError] = AlbertDistError
) -> Path | str:
    """`write(tmp)` creates a file at `tmp` beside `path`; it is fsynced and renamed over `path`. A full disk is
    reported as one `error` naming `path`; on any failure `path` keeps what it held; a directory at `path` is
    refused before `write` runs. A URI `path` gets the file written locally, then uploaded as one object (an
    object store replaces an object whole)."""
    if is_uri(path):
        with (
            disk_full_errors(str(path), error),
            object_store_errors(path),
            tempfile.TemporaryDirectory(prefix="albert-publish-") as tmp,
        ):
            write(Path(tmp, "file"))
            fs, target = filesystem(str(path))
            if fs.type_name == "local":  # a file:// URI: its directory may not exist yet (object stores have none)
                fs.create_dir(target.rpartition("/")[0], recursive=True)
            with open(Path(tmp, "file"), "rb") as source, fs.open_output_stream(target) as out:
                shutil.copyfileobj(source, out, 1 << 20)
        return path
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise error(f"refusing to publish to {path}: it is a directory, and a file would be written there")
    with disk_full_errors(str(path), error), _temporary(path) as tmp:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    return path


def publish_bytes(path: str | Path, data: bytes | memoryview, **kwargs) -> Path:
    return publish_file(path, lambda tmp: tmp.write_bytes(data), **kwargs)


def publish_text(path: str | Path, text: str, **kwargs) -> Path:
    return publish_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), **kwargs)


def publish_dir(
    target: str | Path,
    write: Callable[[Path], object],
    *,
    marker: str | None,
    error: type[AlbertDistError] = AlbertDistError,
) -> Path | str:
    """`write(staging)` fills an empty staging directory beside `target`, which then replaces `target`
    (`publishing_dir`; `marker` as there)."""
    with publishing_dir(target, marker=marker, error=error) as staging:
        write(staging)
    return target if is_uri(target) else Path(target)


@contextlib.contextmanager
def publishing_dir(
    target: str | Path, *, marker: str | None, error: type[AlbertDistError] = AlbertDistError
) -> Iterator[Path]:
    """An empty staging directory beside `target`; when the block ends without an exception, its files are
    fsynced and it replaces `target` (see `_swap_in`), else it is removed and `target` keeps what it held.
    `marker` is the file the block writes (a dataset's manifest, a model's config.json): an existing `target`
    without it is refused before the block runs (`check_replaceable`); None for a directory of albert-dist's own
    whatever it holds (a download cache).

    A URI `target` is staged in a local temporary directory and uploaded with `PUBLISHED` (its files' sha256)
    written last: object stores rename nothing atomically, so `fetch_dir` takes the directory as published only
    once that marker is there and every file matches it."""
    if marker is not None:
        check_replaceable(target, marker, error)
    if is_uri(target):
        with disk_full_errors(str(target), error), tempfile.TemporaryDirectory(prefix="albert-publish-") as tmp:
            yield Path(tmp)
            files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(Path(tmp).rglob("*")) if p.is_file()}
            Path(tmp, PUBLISHED).write_text(json.dumps({"files": files}, indent=1))
            upload_dir(Path(tmp), str(target), last=PUBLISHED, error=error)
        return
    target = Path(target)
    with disk_full_errors(str(target), error), _temporary(target) as staging:
        staging.mkdir()
        yield staging
        for directory, _, names in os.walk(staging):
            for name in names:
                _fsync(Path(directory, name))
        _swap_in(staging, target)


@contextlib.contextmanager
def _temporary(target: Path) -> Iterator[Path]:
    """A fresh temporary name beside `target` (crashed publishes' leftovers removed first), deleted at the end
    unless something was renamed over `target` from it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(target)
    tmp = _temp_name(target)
    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.add(str(tmp))
    try:
        yield tmp
    finally:
        _remove(tmp)  # a half-written copy, or the old target swapped out
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.discard(str(tmp))


def _temp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.publish.{_HOST}.{os.getpid()}.{uuid.uuid4().hex}")


def _remove_stale(target: Path) -> None:
    pattern = re.compile(rf"\.{re.escape(target.name)}\.publish\.(?P<host>[^/]+)\.(?P<pid>\d+)\.[0-9a-f]{{32}}")
    with _IN_FLIGHT_LOCK:
        in_flight = set(_IN_FLIGHT)
    for entry in os.scandir(target.parent):
        match = pattern.fullmatch(entry.name)
        if match and match["host"] == _HOST and entry.path not in in_flight and not _alive(int(match["pid"])):
            _remove(Path(entry.path))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # not in flight here (checked by the caller): left by a failed cleanup or by a reused pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def _remove(path: Path) -> None:
    """Remove a file or a directory tree; what cannot be removed is a stale leftover the next publish retries."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if sys.platform == "linux" else None
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]


def _swap_in(staging: Path, target: Path) -> None:
    """Put `staging` at `target`; the old target, if any, ends up at `staging`'s name.

    On Linux both are swapped in one `renameat2(RENAME_EXCHANGE)`, so `target` never goes missing. Where that is
    unavailable (another OS, an old libc or kernel, a filesystem without it), the old target is renamed aside
    first: for a moment between the two renames there is no `target`.
    """
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(staging), _AT_FDCWD, os.fsencode(target), _RENAME_EXCHANGE) == 0:
            return
        code = ctypes.get_errno()
        if code == errno.ENOENT and not os.path.lexists(target):
            os.rename(staging, target)  # nothing to swap with: the first publish
            return
        if code not in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), str(staging), None, str(target))
    aside = _temp_name(target)  # a crash before the old copy is removed leaves a stale leftover, not a blocker
    if os.path.lexists(target):
        os.rename(target, aside)
    os.rename(staging, target)
    _remove(aside)


def read_bytes(location: str | Path) -> bytes:
    """The content of a local file or of an object at a URI; FileNotFoundError when there is none."""
    if not is_uri(location):
        return Path(location).read_bytes()
    import pyarrow.fs as pafs

    fs, path = filesystem(str(location))
    with object_store_errors(location):
        if fs.get_file_info(path).type != pafs.FileType.File:
            raise FileNotFoundError(str(location))
        with fs.open_input_stream(path) as stream:
            return stream.read()


def check_replaceable(target: str | Path, marker: str, error: type[AlbertDistError] = AlbertDistError) -> None:
    """Refuse to publish over what no publish of the same kind made: a file, or a directory (under a URI, objects)
    holding neither `marker`, the file every such publish writes, nor an upload's `UPLOADING`. A publish replaces
    its target whole, so an output mistyped as the corpus's directory or someone's documents would delete them."""
    is_file, names = _existing(target)
    if is_file or (names and not names & {marker, UPLOADING}):
        what = "is a file" if is_file else f"holds files and no {marker}"
        raise error(
            f"refusing to publish to {target}: it {what}, so no earlier output of this kind, and publishing "
            f"replaces it whole (deleting what it holds); choose a new or empty directory"
        )


def _existing(target: str | Path) -> tuple[bool, set[str]]:
    """Whether `target` is a file (or a link), and the names in it when it is a directory (none when missing)."""
    if not is_uri(target):
        if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
            return True, set()
        return False, set(os.listdir(target)) if os.path.isdir(target) else set()
    import pyarrow.fs as pafs

    fs, path = filesystem(str(target))
    with object_store_errors(target):
        kind = fs.get_file_info(path).type
        if kind != pafs.FileType.Directory:
            return kind == pafs.FileType.File, set()
        return False, {info.base_name for info in fs.get_file_info(pafs.FileSelector(path))}


#: written first under a URI while `upload_dir` replaces what is there, deleted last: an upload cut off leaves it,
#: so that the next publish knows the objects there for an earlier publish's
UPLOADING = ".albert-dist-uploading"


def upload_dir(stage: Path, location: str, *, last: str, error: type[AlbertDistError] = AlbertDistError) -> None:
    """Replace what is under the URI `location` with the files of `stage`, `stage/last` last: object stores rename
    nothing atomically (a "move" of a prefix copies object by object), but readers take the directory through
    `last` (a dataset's manifest, a model's `PUBLISHED`), so the old one stops being complete before anything of
    it is replaced, and the new one becomes complete with its last object. An upload that fails half-way leaves
    no `last`, and `UPLOADING`; objects that are neither an earlier upload's nor one cut off are refused
    (`check_replaceable`)."""
    import pyarrow.fs as pafs

    check_replaceable(location, last, error)
    fs, path = filesystem(str(location))
    with object_store_errors(location):
        if fs.type_name == "local":  # a file:// URI: its directory may not exist yet (object stores have none)
            fs.create_dir(path, recursive=True)
        with fs.open_output_stream(f"{path}/{UPLOADING}") as out:
            out.write(b"")
        if fs.get_file_info(f"{path}/{last}").type == pafs.FileType.File:
            fs.delete_file(f"{path}/{last}")
        for old in fs.get_file_info(pafs.FileSelector(path)):  # the new directory may have fewer files
            if old.base_name != UPLOADING:
                fs.delete_dir(old.path) if old.type == pafs.FileType.Directory else fs.delete_file(old.path)
        for part in sorted(stage.iterdir(), key=lambda p: p.name == last):
            if part.is_dir():
                fs.create_dir(f"{path}/{part.name}")  # a local file:// target needs it; on S3 an empty marker
            pafs.copy_files(
                str(part), f"{path}/{part.name}", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs
            )
        fs.delete_file(f"{path}/{UPLOADING}")


def download_dir(location: str, *, complete: str) -> Path:
    """A local copy of the directory at the URI `location`, in its staging directory (`staging_dir`),
    downloaded unless the copy there already has the same `complete` file (the directory's manifest or
    `PUBLISHED`), which must exist at `location`: without it the directory is incomplete (CheckpointError)."""
    import pyarrow.fs as pafs

    try:
        marker = read_bytes(join_location(location, complete))
    except FileNotFoundError:
        raise CheckpointError(f"{location} has no {complete}: not published, or its upload was cut off") from None
    local = staging_dir(location)
    if (local / complete).is_file() and (local / complete).read_bytes() == marker:
        return local
    fs, path = filesystem(str(location))
    with object_store_errors(location):
        publish_dir(
            local,
            lambda d: pafs.copy_files(
                path, str(d), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem()
            ),
            marker=None,  # the location's own cache: a copy cut off or changed is downloaded again over it
        )
    return local


def fetch_dir(location: str | Path) -> Path:
    """A directory `publishing_dir` published, as a local path: a local one as it is; a URI's downloaded to its
    staging directory and checked against its `PUBLISHED` file (CheckpointError naming what does not match)."""
    if not is_uri(location):
        return Path(location)
    local = download_dir(str(location), complete=PUBLISHED)
    for name, digest in json.loads((local / PUBLISHED).read_text())["files"].items():
        if not (local / name).is_file() or sha256_file(local / name) != digest:
            raise CheckpointError(f"{location}: {name} does not match what was published (changed or cut off)")
    return local


def private_file(text: str, prefix: str) -> Path:
    """`text` in a new file of a new directory, both this user's alone (0700, 0600), removed when the process exits:
    how a command hands over a token it made without printing it."""
    import atexit
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=prefix))  # mode 700
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "token"
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(text)
    return path
