"""What a command prints: our progress lines, stage headers and summaries; Ray's own log lines go to a file.

Quiet (the default): of what Ray forwards from its workers, their standard output (our progress lines) is printed
as usual and their standard error (Ray's and Ray Data's loggers, the core's warnings) is appended to
`<Ray session>/logs/albert-dist-hidden.log`, whose path is printed once; Ray Data's console handler in this
process prints nothing (its full log stays in the session's `ray-data.log`): an execution that fails raises, and
the command prints that error once, ours as one line. `--verbose` or
ALBERT_DIST_VERBOSE=1 shows everything, as Ray does by default.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

VERBOSE_ENV = "ALBERT_DIST_VERBOSE"
MLFLOW_PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
HIDDEN_LOG = "albert-dist-hidden.log"
_HANDLER = "ray_print_logs"  # the name Ray gives its handler of forwarded worker output


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def set_verbose() -> None:
    """`--verbose`: for this process and what it starts (a local Ray's workers inherit it)."""
    os.environ[VERBOSE_ENV] = "1"


def quiet_ray() -> Path | None:
    """Call right after `ray.init(log_to_driver=True)`: in quiet mode, route the workers' standard error to the
    hidden log and return its path (printed here once per process); None in verbose mode."""
    import ray
    from ray._private import worker

    if not sys.stdout.isatty():  # a log file or a pipe: the workers' prefixes without colour codes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    if verbose() or not ray.is_initialized():
        return None
    session = Path(worker._global_node.get_session_dir_path()) if worker._global_node else None
    path = (session / "logs" if session else Path.cwd()) / HIDDEN_LOG
    dispatcher = worker.global_worker_stdstream_dispatcher
    if any(name == _HANDLER for name, _ in dispatcher.handlers):  # log_to_driver is on
        dispatcher.remove_handler(_HANDLER)
        dispatcher.add_handler(
            _HANDLER,
            functools.partial(
                _forward, path, worker.print_to_stdstream, worker._should_ignore_worker_log_prefix(worker.global_worker)
            ),
        )
    import ray.data  # noqa: F401 - configures its loggers, whose console handler is quieted here

    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.CRITICAL)  # its warnings and a failed task's traceback stay in its file
    print(f"Ray's logs: {path} (and the session's {path.parent}); --verbose shows them here")
    return path


@functools.cache  # once per process: the tracking client asks for it at every request
def quiet_mlflow() -> None:
    """MLflow's own console output, everywhere the project talks to MLflow (the CLI, drivers, workers): no "View run
    … at <URI>" line (the jobs print where their run is themselves) and, unless verbose, no INFO lines about setting
    up a new SQLite store or about the system metrics' monitor starting and stopping."""
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    if not verbose():
        for name in ("mlflow.store.db.utils", "alembic.runtime.migration", "mlflow.system_metrics"):
            logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def mlflow_muted() -> Iterator[None]:
    """While a model is logged: no progress bar, advice or warning about what is deliberate there (a Python object
    without type hints or input example, pickled by reference to the installed package); errors still show."""
    logger = logging.getLogger("mlflow")
    level, bar = logger.level, os.environ.get(MLFLOW_PROGRESS_BAR)
    os.environ[MLFLOW_PROGRESS_BAR] = "false"
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        logger.setLevel(level)
        if bar is None:
            os.environ.pop(MLFLOW_PROGRESS_BAR, None)
        else:
            os.environ[MLFLOW_PROGRESS_BAR] = bar


def tune_verbosity() -> int | None:
    """Ray Tune's `verbose`: its default (live tables) with --verbose, else 0 through its legacy reporter: the
    newer one prints its start banner even at 0 (Ray 2.60)."""
    if verbose():
        return None
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    return 0


def quiet_optuna() -> None:
    """Quiet mode: Optuna's INFO lines ("A new study created in memory ...") are not shown. Call after importing
    it: Optuna sets its own level when first imported."""
    if not verbose():
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)


_file_lock = threading.Lock()


def _forward(path: Path, print_to_stdstream: Callable, ignore_prefix: bool, data: dict) -> None:
    """Worker stdout to the console as Ray prints it; worker stderr to the hidden log, with its origin."""
    if not data.get("is_err"):
        print_to_stdstream(data, ignore_prefix=ignore_prefix)
        return
    origin = data.get("actor_name") or data.get("task_name") or "worker"
    with _file_lock, open(path, "a", encoding="utf-8") as f:
        f.writelines(f"({origin} pid={data.get('pid')}) {line}\n" for line in data.get("lines", []))


class ProgressLine:
    """One line for every long operation: `<label>: <count> <unit> (<rate>/s) | <pct>% | ETA <duration>`, e.g.
    `predict: 3,072/10,000 rows (512/s) | 31% | ETA 0:14`; the count reads `3,072 rows` without a `total`. Printed
    at most every `every_s` seconds, and by `finish`. The share and ETA need the work done (0..1): count/total, or
    an estimate the caller passes from whatever it can measure.

    `print_fn` None prints with whatever `print` is when the line is due: Ray Train replaces builtins.print in its
    workers, and Tune pickles its callbacks (a bound function of this process would not do)."""

    def __init__(
        self,
        label: str,
        unit: str = "rows",
        total: int | None = None,
        every_s: float = 10.0,
        print_fn: Callable[[str], None] | None = None,
    ):
        self.label, self.unit, self.total, self.every_s, self.print_fn = label, unit, total, every_s, print_fn
        self.count, self.start, self.last = 0, time.perf_counter(), time.perf_counter()

    def update(self, count: int, done: float | None = None) -> None:
        self.count += count
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            self.last = now
            self._print(self.line(done))

    def finish(self) -> None:
        """The line as it stands, printed now: the last one of the operation."""
        self._print(self.line())

    def line(self, done: float | None = None) -> str:
        elapsed = max(1e-9, time.perf_counter() - self.start)
        count = f"{self.count:,}/{self.total:,}" if self.total is not None else f"{self.count:,}"
        text = f"{self.label}: {count} {self.unit} ({_rate(self.count / elapsed)}/s)"
        if done is None and self.total:
            done = self.count / self.total
        if done is not None and 0 < done <= 1:
            text += f" | {100 * done:.0f}% | ETA {format_duration(elapsed * (1 - done) / done)}"
        return text

    def _print(self, text: str) -> None:
        (self.print_fn or print)(text)


def _rate(per_second: float) -> str:
    """Thousands separated from 10/s up; below, two significant digits without an exponent (a sweep of 3-hour
    trials finishes 0.000093 trials/s)."""
    rounded = float(f"{per_second:.2g}")
    if rounded >= 10:
        return f"{per_second:,.0f}"
    if rounded <= 0:
        return "0"
    return f"{rounded:.{1 - math.floor(math.log10(rounded))}f}"


def format_duration(seconds: float) -> str:
    """`0:12`, `1:05`, `1:02:03` (hours from an hour up); `?` for an unknown (infinite or negative) duration."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
