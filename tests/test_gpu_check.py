"""benchmarks/gpu_check.sh refuses to claim success without a GPU, passes only when every step ran and passed, and
runs tests/test_gpu.py with options and marks that work (no mark error from conftest's checks); its Python part runs
on the CPU (so it cannot rot where no GPU is), and what it imports runs on a bare GPU image (no Ray, MLflow, optuna,
jieba)."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[1]


def run(*command: str, timeout: int, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable, **env}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_gpu_check_fails_in_one_line_without_a_gpu():
    assert not torch.cuda.is_available()  # CI's machine: this test is about what happens there
    done = run("bash", "benchmarks/gpu_check.sh", timeout=120)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(lines) == 1 and lines[0].startswith("gpu_check: FAIL: ")
    assert ("CPU build" if torch.version.cuda is None else "no CUDA device") in lines[0]


def test_the_check_runs_on_the_cpu():
    done = run(sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", timeout=900)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    rows = [line for line in out.splitlines() if line.startswith(("PASS  ", "FAIL  "))]
    assert len(rows) == 9 and all(row.startswith("PASS") for row in rows), rows
    assert "gloo (CPU): replicas identical" in out and "weights bit-identical" in out
    assert out.strip().splitlines()[-1] == "PASS: 9/9 items on cpu"


def test_the_check_asked_for_cuda_refuses_without_it():
    done = run(sys.executable, "benchmarks/gpu_check.py", "--device", "cuda", timeout=120)
    assert done.returncode == 1 and done.stdout.startswith("FAIL: no CUDA device visible")


def test_the_check_imports_nothing_a_bare_gpu_image_lacks():
    probe = (
        "import sys; sys.path.insert(0, 'benchmarks'); import gpu_check, bench_model; "
        "print(sorted({'ray', 'mlflow', 'optuna', 'jieba'} & {m.split('.')[0] for m in sys.modules}))"
    )
    done = run(sys.executable, "-c", probe, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


# python as gpu_check.sh calls it, on a machine with one GPU: each step exits with its $FAKE_ variable (0 unless
# set), and the import of a module named in $FAKE_MISSING fails
FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in
*device_count*) echo "torch 0.0 | CUDA 0.0 | 1 device(s): a fake GPU" ;;
"-c import "*) for module in $FAKE_MISSING; do [ "$2" = "import $module" ] && exit 1; done; exit 0 ;;
*gpu_check.py*) exit "${FAKE_CHECK:-0}" ;;
*"-m pytest"*) exit "${FAKE_PYTEST:-0}" ;;
*bench_model.py*) exit "${FAKE_BENCH:-0}" ;;
esac
"""


@pytest.mark.parametrize(
    "fault, failing",
    [
        ({}, None),
        ({"FAKE_CHECK": "1"}, "FAIL  one-process check"),
        ({"FAKE_MISSING": "mlflow"}, "FAIL  tests/test_gpu.py not run: mlflow does not import here"),
        ({"FAKE_PYTEST": "1"}, "FAIL  tests/test_gpu.py"),
        ({"FAKE_MISSING": "transformers"}, "FAIL  throughput not measured: transformers does not import here"),
        ({"FAKE_BENCH": "1"}, "FAIL  throughput goals"),
    ],
    ids=["all-pass", "check-fails", "no-mlflow", "test-gpu-fails", "no-transformers", "goal-missed"],
)
def test_gpu_check_passes_only_when_every_step_ran_and_passed(tmp_path, fault, failing):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    done = run("bash", "benchmarks/gpu_check.sh", timeout=60, PYTHON=str(fake), **fault)
    out = done.stdout + done.stderr
    lines = out.strip().splitlines()
    summary = lines[lines.index("== gpu_check summary") + 1 : -1]
    assert "SKIP" not in out and len(summary) >= 3, out
    if failing is None:
        assert done.returncode == 0 and lines[-1] == "gpu_check: PASS", out
        assert all(line.startswith("PASS  ") for line in summary), out
    else:
        assert done.returncode == 1 and lines[-1] == "gpu_check: FAIL", out
        failed = [line for line in summary if not line.startswith("PASS  ")]
        assert len(failed) == 1 and failed[0].startswith(failing), out


# a pytest plugin that writes each collected test's id, marks and fixtures (those of its fixtures too) to $MARKS_OUT
MARKS_PLUGIN = """
import json, os

def pytest_collection_finish(session):
    with open(os.environ["MARKS_OUT"], "w") as out:
        json.dump([{"id": item.nodeid, "marks": sorted({mark.name for mark in item.iter_markers()}),
                    "fixtures": sorted(item.fixturenames)} for item in session.items], out)
"""


def collected_ids(stdout: str) -> set[str]:
    return {line for line in stdout.splitlines() if "::" in line}


def test_the_gpu_steps_pytest_collects_every_gpu_test_and_ray_train_ones_are_slow(tmp_path):
    """Step 2's own pytest command collects every test of tests/test_gpu.py; those that take the session's Ray (what
    a Ray Train run needs: `ray_session`, directly or through a fixture) are marked slow, as conftest requires before
    it lets one start, and `-m "gpu and not slow"` without conftest collects exactly the others."""
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    step = re.findall(r'"\$PYTHON" -m pytest (.+)$', script, re.M)
    assert len(step) == 1, step
    (tmp_path / "marks_plugin.py").write_text(MARKS_PLUGIN)
    out = tmp_path / "marks.json"
    done = run(
        sys.executable,
        "-m",
        "pytest",
        *shlex.split(step[0]),
        "--collect-only",
        "-p",
        "marks_plugin",
        timeout=300,
        PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
        MARKS_OUT=str(out),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    items = {item["id"]: item for item in json.loads(out.read_text())}
    assert collected_ids(done.stdout) == set(items)
    defined = set(re.findall(r"^def (test_\w+)", (ROOT / "tests" / "test_gpu.py").read_text(), re.M))
    assert {test.split("::")[1].split("[")[0] for test in items} == defined
    assert all("gpu" in item["marks"] for item in items.values())
    ray_train = {test for test, item in items.items() if "ray_session" in item["fixtures"]}
    assert len(ray_train) == 2 and all("slow" in items[test]["marks"] for test in ray_train), ray_train
    assert any(re.search(r"_ddp_on_cuda\[(nccl-2-ranks-on-2-gpus|gloo-2-ranks-on-1-gpu)\]$", t) for t in ray_train)

    quick = run(
        sys.executable,
        "-m",
        "pytest",
        "tests/test_gpu.py",
        "--collect-only",
        "-q",
        "--noconftest",
        "-p",
        "no:cacheprovider",
        "-m",
        "gpu and not slow",
        timeout=300,
    )
    assert quick.returncode == 0, quick.stdout[-3000:] + quick.stderr[-3000:]
    assert collected_ids(quick.stdout) == set(items) - ray_train
