"""benchmarks/gpu_check.sh refuses to claim success without a GPU, its Python part runs on the CPU (so it cannot
rot where no GPU is), and what it imports runs on a bare GPU image (no Ray, MLflow, optuna, jieba)."""

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).parents[1]


def run(*command: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable}
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
