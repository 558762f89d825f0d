#!/usr/bin/env bash
# The GPU check (issue 15), one script, under 8 minutes on one H200: the `gpu`-marked tests (Ray Train over nccl,
# fp16 + GradScaler with LAMB, bf16 autocast, a checkpoint moved from GPU to CPU, attention on CUDA), then the
# training-step throughput/MFU table of ALBERT-base and -large at 128 and 512 tokens, bf16 and fp16, ours against
# transformers. Without a CUDA device the tests skip and the table is not measured (exit status 0).
#
#   bash benchmarks/gpu_check.sh            # PYTHON=/path/to/python to choose the interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1

"$PYTHON" -c "import torch; print('torch', torch.__version__, '| CUDA devices:', torch.cuda.device_count(),
      *(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))"

echo "== gpu-marked tests"
timeout 300 "$PYTHON" -m pytest tests/test_gpu.py -m gpu -q -p no:randomly -rs

if ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "== no CUDA device: the gpu tests skipped and the throughput table is not measured"
    exit 0
fi
echo "== training-step throughput, ours vs transformers (tokens/s, MFU of the measured GEMM peak)"
timeout 180 "$PYTHON" benchmarks/bench_model.py --device cuda --presets base,large --shapes 32x128,8x512 \
    --dtypes bf16,fp16 --steps 5 --rounds 3
