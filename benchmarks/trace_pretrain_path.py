"""How far a reader follows one pretraining run: the package files that `albert-dist pretrain` passes through, from
the command line to the first optimizer step and to the saved model, and how often execution comes back to a
file it had left (a re-entry).

The driver is traced in this process (sys.setprofile); the Ray Train worker (one, `scaling.num_workers=1`) in its
own process, through a `worker_process_setup_hook` installed with the local Ray. Calls of functions of
`albert_dist/` count (module and class bodies, run at import, do not); calls of other packages are transparent, so
a call from `pretrain.py` through Ray into `ray_runner.py` reads as pretrain.py → ray_runner.py. The path to the
first step is the driver's until Ray Train's `fit` starts, then the worker's until the first `optimizer.step`; to
the saved model, the worker's until its training function returns, then the driver's until the command ends.

Each path is read two ways:
- every call: the sequence of files whose functions are called, so `A → B → A` when a function of A calls B and
  then another function of A;
- calls that leave their file: only calls into a file other than the caller's, as a reader following the calls
  opens files; returning to the caller, or calling a neighbour in the same file, is staying.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/trace_pretrain_path.py [--show] [--transparent storage.py ...]

prints, for each path and reading, the number of files, of visits and of re-entries (visits − files), and with
--show the files in the order they are visited.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path

PACKAGE = os.sep + "albert_dist" + os.sep


CALLED_WITHIN = "="


def package_file(frame, transparent: frozenset[str] = frozenset()) -> str | None:
    """The package file of `frame`'s function, None outside the package, in the `transparent` files (read like
    another package's) and for module and class bodies (they run at import: definitions a reader reads where they
    stand, not calls to follow)."""
    name = frame.f_code.co_filename
    if PACKAGE not in name or not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        return None
    path = name[name.rindex(PACKAGE) + 1 :]
    return None if path.removeprefix("albert_dist/") in transparent else path


def tracer(sink: list[str], stop_on_step: list[bool] | None = None, transparent: frozenset[str] = frozenset()):
    """A profile function appending to `sink` the package file of each call of a package function, marked with
    `CALLED_WITHIN` where the call came from a function of that same file."""

    def profile(frame, event, arg):
        if event != "call":
            return
        path = package_file(frame, transparent)
        if path is not None:
            caller = frame.f_back
            while caller is not None and package_file(caller, transparent) is None:
                caller = caller.f_back
            within = caller is not None and package_file(caller, transparent) == path
            sink.append(CALLED_WITHIN + path if within else path)
        if (
            event == "call"
            and frame.f_code.co_name == "fit"
            and "/ray/train/" in frame.f_code.co_filename
            and "--fit--" not in sink
        ):
            sink.append("--fit--")
        if (
            stop_on_step is not None
            and event == "call"
            and frame.f_code.co_name == "step"
            and "torch/optim" in frame.f_code.co_filename
            and not stop_on_step
        ):
            stop_on_step.append(True)
            sink.append("--first-step--")

    return profile


def worker_hook(out_dir: str, original: str | None, transparent: frozenset[str]):
    """The setup hook of every Ray worker process: the local Ray's own (`original`, "module.function"), then
    trace into `out_dir/<pid>.json`, written at the first optimizer step and when the training function returns."""

    def hook() -> None:
        import importlib
        import os
        import sys
        import threading

        if original:
            module, _, function = original.rpartition(".")
            getattr(importlib.import_module(module), function)()

        sink: list[str] = []
        stepped: list[bool] = []
        inner = tracer(sink, stepped, transparent)
        path = os.path.join(out_dir, f"{os.getpid()}.json")

        def dump() -> None:
            with open(path, "w") as f:
                json.dump(sink, f)

        def profile(frame, event, arg):
            inner(frame, event, arg)
            if (
                event == "call"
                and frame.f_code.co_name == "step"
                and "torch/optim" in frame.f_code.co_filename
                and sink.count("--first-step--") == 1
                and not getattr(profile, "dumped", False)
            ):
                profile.dumped = True
                dump()
            if event == "return" and frame.f_code.co_name == "_train_worker":
                dump()

        sys.setprofile(profile)
        threading.setprofile(profile)  # Ray Train runs the training function in a thread of its own

    return hook


def readings(trace: list[str]) -> dict[str, list[str]]:
    """The trace read two ways, each a list of files with no file twice in a row: every call, and only the calls
    that leave their caller's file (a return, and a call to a neighbour in the same file, stay where the reader
    already is)."""
    calls = [entry for entry in trace if not entry.startswith("--")]
    every = [entry.removeprefix(CALLED_WITHIN) for entry in calls]
    leaving = [entry for entry in calls if not entry.startswith(CALLED_WITHIN)]
    return {
        "every call": [path for path, _ in itertools.groupby(every)],
        "calls that leave their file": [path for path, _ in itertools.groupby(leaving)],
    }


def summary(path: list[str]) -> tuple[int, int, int]:
    """(files, visits, re-entries): a re-entry is a visit to a file the path had already visited."""
    return len(set(path)), len(path), len(path) - len(set(path))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", action="store_true", help="print the files in the order visited")
    parser.add_argument(
        "--transparent",
        nargs="*",
        default=[],
        metavar="FILE",
        help="package files read as transparent, like another package's (e.g. storage.py errors.py)",
    )
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    transparent = frozenset(args.transparent)
    from albert_dist import cli
    from albert_dist.cluster.ray_init import start_local_ray
    from albert_dist.demo.corpus import write_stdlib_corpus

    root = Path(tempfile.mkdtemp(prefix="trace-pretrain-"))
    corpus = write_stdlib_corpus(root / "corpus.txt", 60_000)
    trace_dir = root / "worker-trace"
    trace_dir.mkdir()
    import ray

    real_init = ray.init

    def init(*args, runtime_env=None, **kwargs):  # the local Ray's workers run its setup hook, then the tracer
        runtime_env = dict(runtime_env or {})
        runtime_env["worker_process_setup_hook"] = worker_hook(
            str(trace_dir), runtime_env.get("worker_process_setup_hook"), transparent
        )
        return real_init(*args, runtime_env=runtime_env, **kwargs)

    ray.init = init
    start_local_ray(configure_logging=False)
    common = [f"run.output_dir={root}"]
    if (
        cli.main(
            [
                "data",
                "prepare",
                "--set",
                f"data.inputs=[{corpus}]",
                "--set",
                "data.max_seq_length=64",
                "--set",
                "tokenizer.vocab_size=500",
                *sum((["--set", s] for s in common), []),
            ]
        )
        != 0
    ):
        return 1
    driver: list[str] = []
    sys.setprofile(tracer(driver, transparent=transparent))
    try:
        status = cli.main(
            [
                "pretrain",
                *sum(
                    (
                        ["--set", s]
                        for s in common
                        + [
                            "run.name=trace",
                            "scaling.num_workers=1",
                            "scaling.cpus_per_worker=1",
                            "model.hidden_size=64",
                            "model.num_attention_heads=2",
                            "model.intermediate_size=128",
                            "model.embedding_size=32",
                            "model.num_hidden_layers=2",
                            "train.max_steps=2",
                            "train.warmup_steps=1",
                            "train.batch_size=4",
                            "train.eval_every=2",
                            "train.checkpoint_every=2",
                            "train.eval_batches=1",
                            "train.precision=fp32",
                        ]
                    ),
                    [],
                ),
            ]
        )
    finally:
        sys.setprofile(None)
    if status != 0:
        return status
    worker = next(
        (w for w in (json.loads(p.read_text()) for p in trace_dir.glob("*.json")) if "--first-step--" in w), None
    )
    if worker is None:
        print("no worker reached an optimizer step (the worker setup hook did not run?)", file=sys.stderr)
        return 1
    fit_at = driver.index("--fit--")  # the driver hands over to the worker there
    first_step = driver[:fit_at] + worker[: worker.index("--first-step--")]
    saved = driver[:fit_at] + worker + driver[fit_at:]
    for label, trace in (("to the first optimizer step", first_step), ("to the saved model", saved)):
        for reading, path in readings(trace).items():
            files, visits, reentries = summary(path)
            print(f"{label}, {reading}: {files} files, {visits} visits, {reentries} re-entries")
            if args.show:
                print("  " + " → ".join(p.removeprefix("albert_dist/") for p in path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
