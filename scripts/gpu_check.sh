#!/usr/bin/env bash
# The zoo on one GPU in about ten minutes, one report (report.json, report.md) whose sections run in priority order:
# every family in float32 / float16 / bfloat16 against float64 on the CPU, the GPU kernels against the PyTorch path,
# training with validation and eval, FSDP2 and ZeRO-3 stopped and resumed, compiled decoding, the bench
# (`energyzoo/bench/gpu_check.py` says what each section checks). Install first (README, "Installing on a GPU").
#   bash scripts/gpu_check.sh                    # into ./gpu-check
#   OUT=gpu-check-quick bash scripts/gpu_check.sh --sections families kernels
set -euo pipefail
python -c "import energyzoo" 2>/dev/null || { echo "energyzoo is not installed: pip install -e '.[all,cuda]'"; exit 2; }
exec python -m energyzoo.bench.gpu_check --output "${OUT:-gpu-check}" "$@"
