#!/usr/bin/env bash
# The GPU check, one script, under 8 minutes on one H100 (its steps' timeouts add up to 7 min 20 s, and 5 s more
# each to kill a step that ignores the first signal), with the machine's own PyTorch. It refuses to run (exit 1, one
# line) without a CUDA device or on a CPU build of torch: it never reports success having touched no GPU. A step that
# cannot run (a module it needs does not import) is a FAIL; the last line is "gpu_check: PASS" only when every step
# passed, else "gpu_check: FAIL" and exit status 1.
#
#   1. benchmarks/gpu_check.py --device cuda: in one process, without Ray, the Trainer with pretraining (MLM + SOP,
#      padded and packed), fine-tuning, distillation and predict, bf16 and fp16 + GradScaler, AdamW and LAMB; exact
#      resume with dropout on under train.deterministic; a checkpoint written on the GPU resumed on the CPU; DDP with
#      2 ranks (gloo on one GPU, and nccl when there are two or more)
#   2. tests/test_gpu.py -m gpu (needs ray, mlflow and pytest): Ray Train fine-tuning with DDP on GPU workers (nccl
#      on two GPUs, gloo with two ranks on one), pretraining resumed bit for bit under train.deterministic,
#      attention on CUDA against the CPU; a skipped test fails the step (--fail-on-skip)
#   3. training-step tokens/s of ours and transformers' AlbertForPreTraining (needs transformers), base 32x128 and
#      large 8x512, bf16, with MFU against the bf16 matmul peak measured in the same run; bench_model.py exits 1
#      when a goal is missed (ours >= 1.5x transformers at base 32x128, MFU >= 50% at large 8x512)
# The wheels a bare GPU image lacks, and how to carry them: benchmarks/README.md ("The GPU check").
#
#   bash benchmarks/gpu_check.sh            # PYTHON=/path/to/python to choose the interpreter
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
# cuBLAS reads its workspace setting once, at the process's first matmul: set before anything runs
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 \
    CUBLAS_WORKSPACE_CONFIG=:4096:8

if ! reason=$("$PYTHON" -c "
import torch
if torch.version.cuda is None:
    print(f'torch {torch.__version__} is a CPU build: install a CUDA build of PyTorch'); raise SystemExit(1)
if torch.cuda.device_count() == 0:
    print(f'no CUDA device visible to torch {torch.__version__} (CUDA {torch.version.cuda})'); raise SystemExit(1)
print('torch', torch.__version__, '| CUDA', torch.version.cuda, '|', torch.cuda.device_count(), 'device(s):',
      ', '.join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
" 2>&1); then
    echo "gpu_check: FAIL: ${reason##*$'\n'}"
    exit 1
fi
echo "$reason"
declare -a results
record() {  # record NAME STATUS: STATUS 0 is PASS
    if [ "$2" -eq 0 ]; then results+=("PASS  $1"); else results+=("FAIL  $1 (exit $2)"); fi
}
missing() {  # the modules among "$@" that do not import here
    local module lacking=()
    for module in "$@"; do "$PYTHON" -c "import $module" >/dev/null 2>&1 || lacking+=("$module"); done
    echo "${lacking[*]}"
}

echo "== 1. the one-process check"
timeout -k 5 150 "$PYTHON" benchmarks/gpu_check.py --device cuda
record "one-process check (table above)" $?

echo "== 2. Ray Train on the GPU"
lacking=$(missing ray mlflow pytest)
if [ -z "$lacking" ]; then
    timeout -k 5 200 "$PYTHON" -m pytest tests/test_gpu.py -m gpu -q -p no:randomly -p no:cacheprovider --fail-on-skip
    record "tests/test_gpu.py: Ray Train DDP and exact pretraining resume on GPU, attention on CUDA against the CPU" $?
else
    results+=("FAIL  tests/test_gpu.py not run: $lacking does not import here (install it in this Python)")
fi

echo "== 3. training-step throughput, ours vs transformers (tokens/s, MFU of the bf16 GEMM peak measured here)"
lacking=$(missing transformers)
if [ -z "$lacking" ]; then
    timeout -k 5 90 "$PYTHON" benchmarks/bench_model.py --device cuda --presets base,large --shapes 32x128,8x512 \
        --dtypes bf16 --steps 5 --rounds 3
    record "throughput goals: ours >= 1.5x transformers at base 32x128, MFU >= 50% at large 8x512 (goal lines above)" $?
else
    results+=("FAIL  throughput not measured: $lacking does not import here (benchmarks/README.md lists its wheels)")
fi

echo
echo "== gpu_check summary"
printf '%s\n' "${results[@]}"
if [ "${#results[@]}" -eq 0 ] || printf '%s\n' "${results[@]}" | grep -qv '^PASS'; then
    echo "gpu_check: FAIL"
    exit 1
fi
echo "gpu_check: PASS"
