#!/usr/bin/env bash
# GPU smoke run of sharded training, for a user with one GPU or more: the tiny FEM-LM recipe (offline data) under
# FSDP2 and under DeepSpeed ZeRO-3, on one GPU and on every visible GPU, 2 micro-batches per step, bf16, killed after
# 6 steps and resumed from its checkpoint, then the saved folder is loaded and evaluated on the local lm-eval suite.
# Needs CUDA, and `pip install deepspeed` for ZeRO-3 (skipped with a note when it is missing).
#   bash scripts/gpu_smoke.sh              # every visible GPU
#   GPUS=2 OUT=/tmp/smoke bash scripts/gpu_smoke.sh
set -euo pipefail
GPUS=${GPUS:-$(python -c "import torch; print(torch.cuda.device_count())")}
OUT=${OUT:-runs/gpu-smoke}
CONFIGS=$(python -c "from energyzoo.training.recipe_files import shipped_recipe_path; print(shipped_recipe_path('fem-lm-tiny').parent)")
[ "$GPUS" -ge 1 ] || { echo "no CUDA GPU visible"; exit 1; }
engines="fsdp"
if python -c "import deepspeed" 2>/dev/null; then engines="fsdp deepspeed-zero3"; else echo "deepspeed not installed: ZeRO-3 skipped"; fi
for engine in $engines; do
  for processes in $(echo 1 "$GPUS" | tr ' ' '\n' | sort -un); do
    run="$OUT/$engine-$processes"
    args=(training.steps=12 "training.batch_size=$((8 * processes))" training.gradient_accumulation=2
          training.save_every=6 training.eval_every=6 training.mixed_precision=bf16 "output_dir=$run")
    launch=(accelerate launch --config_file "$CONFIGS/accelerate-$engine.yaml" --num_processes "$processes"
            -m energyzoo.cli train fem-lm-tiny "${args[@]}")
    "${launch[@]}" --stop-after 6
    "${launch[@]}" --resume
    energyzoo eval "$run/model" --device cuda --dtype bfloat16 --limit 20
    echo "== $engine on $processes GPU(s): $(tail -n 1 "$run/metrics.jsonl")"
  done
done
