#!/usr/bin/env bash
# GPU smoke run of sharded training, for a user with one GPU or more: the tiny FEM-LM recipe (offline data) under
# FSDP2 and under DeepSpeed ZeRO-3 (skipped, saying so, without deepspeed), on one GPU and on every visible GPU,
# bf16, 2 micro-batches per step, once uninterrupted and once stopped after step 6 and resumed; the resumed weights
# against the uninterrupted ones (the `sharded` section of `energyzoo/bench/gpu_check.py`).
#   bash scripts/gpu_smoke.sh              # every visible GPU
#   GPUS=2 OUT=runs/gpu-smoke-2 bash scripts/gpu_smoke.sh
set -euo pipefail
GPUS=${GPUS:-$(python -c "import torch; print(torch.cuda.device_count())")}
[ "$GPUS" -ge 1 ] || { echo "no CUDA GPU visible"; exit 2; }
exec python -m energyzoo.bench.gpu_check --sections sharded --processes $(echo 1 "$GPUS" | tr ' ' '\n' | sort -un) \
  --output "${OUT:-runs/gpu-smoke}"
