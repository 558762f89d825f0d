"""User-facing errors: the CLI prints their message alone, without a traceback."""

import contextlib
import errno


class AlbertDistError(Exception):
    """Base of every error caused by the user's input (config, files, data) rather than a bug.

    Its message is the one it was raised with, also after a trip through a Ray task: Ray Data appends its retry
    advice to a failed task's exception arguments ("Failed to apply UDF transform after 1/1 attempts … if you
    believe this to be transient"), which is noise under a message about the user's own input.
    """

    def __init__(self, message: str = "", *args):
        super().__init__(message, *args)
        self.message = str(message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return type(self), (self.message,), self.__dict__


class ConfigError(AlbertDistError, ValueError):
    """A configuration that cannot work."""


class CheckpointError(AlbertDistError):
    """A checkpoint directory that is missing, incomplete or corrupted."""


class TokenizerError(AlbertDistError):
    """A tokenizer that cannot be trained or loaded."""


class DataError(AlbertDistError):
    """A corpus or dataset that cannot be read."""


class StorageError(AlbertDistError, OSError):
    """The object store refused a request, or kept failing it past the retries (an OSError, as pyarrow's own)."""


class TrackingError(AlbertDistError):
    """The MLflow tracking store refused a request or did not answer."""


class HubError(AlbertDistError):
    """The Hugging Face Hub refused an upload, or no token was given for one."""


#: what the OS answers a path a user cannot write or read: no permission, a read-only file system
_PATH_REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS)


def user_error(err: BaseException) -> AlbertDistError | None:
    """`err` as the one line a user reads, or None for an error that is a bug (its traceback helps): our own
    errors, and the OS refusing a path of the user's (a run directory on a read-only mount, a corpus or an output
    directory without permission)."""
    if isinstance(err, AlbertDistError):
        return err
    if isinstance(err, OSError) and err.errno in _PATH_REFUSED and err.filename:
        return AlbertDistError(f"{err.filename}: {err.strerror} (a path the config names, or one under it)")
    return None


def raised_in_a_task(err: BaseException) -> AlbertDistError | None:
    """The `AlbertDistError` a Ray task or actor raised, unwrapped from Ray's error layers (whose messages carry the
    task's traceback; Ray's subclass of our class is one of those layers), so the CLI prints its one line."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        cause = getattr(err, "cause", None)
        if isinstance(cause, AlbertDistError) and type(cause).__module__.startswith("albert_dist"):
            return cause
        if isinstance(err, AlbertDistError) and type(err).__module__.startswith("albert_dist"):
            return err
        err = cause if isinstance(cause, BaseException) else err.__cause__
    return None


def is_disk_full(err: BaseException) -> bool:
    """ENOSPC or EDQUOT, also where a writer reports it only in its message (pyarrow, safetensors)."""
    return (isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)) or "No space left on device" in str(
        err
    )


@contextlib.contextmanager
def disk_full_errors(what: str, error: type[AlbertDistError] = AlbertDistError):
    """Report a full disk while writing `what` (which names the path) as one clear line instead of a traceback
    from deep inside a writer; callers write atomically, so what was there before stays intact. An inner
    report (naming a temporary file) is restated in the outer caller's terms."""
    try:
        yield
    except Exception as err:
        cause = err.__cause__ if isinstance(err, AlbertDistError) else err
        if cause is None or not is_disk_full(cause):
            raise
        raise disk_full_error(what, error) from cause


def disk_full_error(what: str, error: type[AlbertDistError] = AlbertDistError) -> AlbertDistError:
    """The one line that says the disk filled up while writing `what`."""
    return error(
        f"no space left on device while writing {what}: free some space or write elsewhere (what was "
        f"there before is kept)"
    )
