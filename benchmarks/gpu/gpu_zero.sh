#!/usr/bin/env bash
# A 2-agent CC team of ~0.5B models on one GPU (benchmarks/gpu/gpu_team.py): plain, DeepSpeed ZeRO-2 and ZeRO-3, one
# process each, one after the other. Each prints one JSON line (median iteration s, generated tokens/s, peak GPU
# memory, seconds per phase); all of them are collected in $OUT/zero.jsonl.
#   bash benchmarks/gpu/gpu_zero.sh                                  # on the GPU machine, from the repository root
# A toy-sized check of the script itself on CPU (fp32, DeepSpeed's CPU accelerator):
#   SIZE=tiny BATCH=4 RESPONSE_LENGTH=8 ITERATIONS=1 OUT=/tmp/gpu_zero bash benchmarks/gpu/gpu_zero.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_zero}
SIZE=${SIZE:-0.5b}
BATCH=${BATCH:-16}
RESPONSE_LENGTH=${RESPONSE_LENGTH:-64}
ITERATIONS=${ITERATIONS:-4}
mkdir -p "$OUT"
: > "$OUT/zero.jsonl"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OPTS=(--size "$SIZE" --batch "$BATCH" --response-length "$RESPONSE_LENGTH" --iterations "$ITERATIONS")
# Build the models once, before any launcher starts processes that would race to build them.
python -c "from trl_collm.testing import tiny_model_dir; tiny_model_dir('$SIZE-qwen2', size='$SIZE')"
port() { python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
status=0
for mode in plain zero2 zero3; do
  echo "== $mode" >&2
  if [ "$mode" = plain ]; then
    cmd=(python benchmarks/gpu/gpu_team.py "${OPTS[@]}" --out "$OUT/run-$mode")
  else
    cmd=(python -m accelerate.commands.launch --num_processes 1 --num_machines 1 --main_process_port "$(port)"
         --config_file "trl_collm/accelerate_configs/$mode.yaml" benchmarks/gpu/gpu_team.py "${OPTS[@]}" --out "$OUT/run-$mode")
    # no GPU: no bf16 (gpu_team.py trains in fp32 on CPU)
    python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || cmd=("${cmd[@]:0:3}" --mixed_precision no "${cmd[@]:3}")
  fi
  if "${cmd[@]}" > "$OUT/$mode.log" 2>&1; then
    grep '^{' "$OUT/$mode.log" | tail -1 | tee -a "$OUT/zero.jsonl"
  else
    echo "$mode failed: see $OUT/$mode.log" >&2
    status=1
  fi
done
exit $status
