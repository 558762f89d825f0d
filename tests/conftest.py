"""Shared fixtures: one local Ray per test session, a stdlib-docstring corpus."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import process_helpers
import pytest

from albert_dist.cluster import ray_init

# Always a private Ray for the session: never attach to a cluster another test (or person) started on the machine.
os.environ["RAY_ADDRESS"] = "local"
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.update(ray_init.WORKER_ENV)  # the workers of the tests' Ray print as the commands' workers do


# The longest files first: the suite runs in two processes that each take the next file when free (`--dist
# loadfile`), so long files started last would leave one process working alone at the end. Each file's seconds come
# from a whole run (`--record-durations tests/durations.json`); a file not recorded yet goes first.
DURATIONS = Path(__file__).with_name("durations.json")


def _recorded_seconds() -> dict[str, float]:
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def pytest_collection_modifyitems(items):
    seconds = _recorded_seconds()
    items.sort(key=lambda item: -seconds.get(item.path.name, float("inf")))  # stable: a file's tests keep their order
    for item in items:
        if item.get_closest_marker("heavy"):
            item.add_marker("slow")  # what starts a cluster of its own is never part of a quick run


def pytest_addoption(parser):
    parser.addoption(
        "--fail-on-skip",
        action="store_true",
        help="print the count of skipped tests and fail the run if any was skipped (CI, where none "
        "should be: a fault test that can no longer set up its fault must not pass unseen; the gpu "
        "tests are deselected by `-m 'not gpu'`, not skipped)",
    )
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="write each test file's seconds (set-up, call and teardown of its tests) to PATH as JSON: the order "
        "the suite runs its files in (tests/durations.json). Give it as --record-durations=PATH: pytest takes a "
        "separate argument naming an existing file outside the checkout for a test path, and then finds neither "
        "its configuration nor this option",
    )


FILE_SECONDS: dict[str, float] = {}  # test file -> seconds of its tests so far


SKIPPED: list = []  # the reports of skipped tests, and of modules skipped whole at collection


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """The running test's marks, for what requires one (`process_helpers.require_mark`) during its set-up, its
    call and its teardown: its fixtures' servers and clusters, and the Ray Train runs and Tune sweeps it starts."""
    _require_marks_to_start_ray_train_and_tune()
    process_helpers.RUNNING_TEST_MARKS = {mark.name for mark in item.iter_markers()}
    yield
    process_helpers.RUNNING_TEST_MARKS = set()


@functools.cache  # once per test process, at its first test (Ray's import stays out of collection)
def _require_marks_to_start_ray_train_and_tune() -> None:
    from ray import tune
    from ray.train import torch as train_torch

    for holder, what in ((train_torch.TorchTrainer, "a Ray Train run"), (tune.Tuner, "a Ray Tune sweep")):

        def fit(self, *args, _fit=holder.fit, _what=what, **kwargs):
            process_helpers.require_mark("slow", _what)
            return _fit(self, *args, **kwargs)

        holder.fit = fit


def pytest_runtest_logreport(report):
    """Every skip, whichever process ran it (pytest-xdist replays its workers' reports in the main process)."""
    if report.skipped and not hasattr(report, "wasxfail"):
        SKIPPED.append(report)
    name = Path(report.location[0]).name
    FILE_SECONDS[name] = FILE_SECONDS.get(name, 0.0) + report.duration


def pytest_collectreport(report):
    """A module skipped whole while it is collected (a module-level `pytest.skip` or `importorskip`): its tests are
    never run, so no test report shows them (pytest-xdist forwards its workers' skipped collections too)."""
    if report.skipped:
        SKIPPED.append(report)


def _counts_skips(config) -> bool:
    return config.getoption("fail_on_skip") and not hasattr(config, "workerinput")  # the main process only


def pytest_terminal_summary(terminalreporter, config):
    if _counts_skips(config):
        terminalreporter.write_line(f"skipped tests: {len(SKIPPED)}", red=bool(SKIPPED))
        for report in SKIPPED:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            terminalreporter.write_line(f"skipped, which fails this run: {report.nodeid}: {reason}", red=True)


def pytest_sessionfinish(session):
    path = session.config.getoption("record_durations")
    if path and not hasattr(session.config, "workerinput"):
        ordered = dict(sorted(FILE_SECONDS.items(), key=lambda item: -item[1]))
        Path(path).write_text(json.dumps({name: round(s, 1) for name, s in ordered.items()}, indent=1) + "\n")
    if _counts_skips(session.config) and SKIPPED and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray with the machine's 2 CPUs, started once for the whole test session as the commands start
    theirs (loopback only, token auth)."""
    import ray

    if not ray.is_initialized():
        # with its dashboard, as the commands' Ray: Ray Train's placement-group cleaner asks the state API it serves
        # whether a training controller is alive; without it, the worker placement group of a trial that Tune's
        # scheduler stopped stays reserved and starves the next trials (an ASHA sweep hung on it)
        # workers import the tests' own task factories ("test_module:function") as the driver does
        # (after a PYTHONPATH the session was given, so a checkout run through it tests its own sources)
        here = os.path.dirname(os.path.abspath(__file__))
        tests = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
        ray_init.start_local_ray(
            num_cpus=2,
            include_dashboard=True,
            object_store_memory=1_500_000_000,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": {"PYTHONPATH": tests}},
        )
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    SESSION_DATA_CONTEXT[:] = [DataContext.get_current().copy()]
    yield ray
    ray.shutdown()


@pytest.fixture
def ordered_ray_data(ray_session):
    """Ray Data keeps block order, as data preparation and the training workers run it, whatever an earlier test
    left in the session's DataContext."""
    from ray.data import DataContext

    options = DataContext.get_current().execution_options
    saved, options.preserve_order = options.preserve_order, True
    yield
    options.preserve_order = saved


@pytest.fixture(scope="session")
def stdlib_corpus(tmp_path_factory):
    """About 600 kB of standard-library docstrings, blank-line separated documents."""
    from albert_dist.demo.corpus import write_stdlib_corpus

    return write_stdlib_corpus(tmp_path_factory.mktemp("corpus") / "stdlib.txt", max_chars=600_000)


@pytest.fixture(autouse=True)
def session_ray_as_new():
    """Each test starts on the session's Ray as on a fresh one: the Ray Data settings the session started with,
    and every CPU free.

    Earlier tests leave settings in the process's DataContext (training and prediction set their own), which a
    later test would depend on without saying so; and they can leave CPUs held: a placement group that a trial
    stopped by Tune's scheduler or a torn-down worker group left reserved (Ray Train's placement-group cleaner
    does not always get to it), or Ray Data actors of an execution an exception cut short, released when the
    garbage collector gets to them. A Ray Data read or a Ray Train run that finds no CPU does not fail, it waits:
    here a test that finds the CPUs still held after a minute fails instead, naming what holds them.
    """
    import ray

    if ray.is_initialized() and SESSION_DATA_CONTEXT:
        from ray.data import DataContext

        DataContext._set_current(SESSION_DATA_CONTEXT[0].copy())
        _release_held_cpus(deadline_s=60)
    yield


SESSION_DATA_CONTEXT: list = []  # the Ray Data settings ray_session started with


def _release_held_cpus(deadline_s: float) -> None:
    import gc
    import time
    from unittest import mock

    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for pg_id, info in ray.util.placement_group_table().items():
        if info.get("state") == "CREATED":
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
    gc.collect()  # an execution cut short ends when its iterator is collected
    total, deadline = ray.cluster_resources().get("CPU", 0.0), time.monotonic() + deadline_s
    while (free := ray.available_resources().get("CPU", 0.0)) < total - 1e-6:
        if time.monotonic() > deadline:
            from ray.util.state import list_actors, list_tasks

            # the state API takes its Ray from $RAY_ADDRESS over any address it is given; "local" makes it look for
            # *the* Ray on the machine, which fails where another runs (the other test process's)
            with mock.patch.dict(os.environ, {"RAY_ADDRESS": ray.get_runtime_context().gcs_address}):
                actors = [a.class_name for a in list_actors(filters=[("state", "=", "ALIVE")])]
                tasks = [t.name for t in list_tasks(filters=[("state", "=", "RUNNING")])]
            pytest.fail(
                f"the session's Ray has {free} of {total} CPUs free {deadline_s:.0f} s after the previous test "
                f"ended; alive actors: {actors}; running tasks: {tasks}"
            )
        time.sleep(0.5)
