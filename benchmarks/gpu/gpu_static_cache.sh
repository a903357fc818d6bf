#!/usr/bin/env bash
# Issue 21 part 4, one GPU sitting, one command (about 5 minutes; results under $OUT): rollout tokens/s of the 0.5B
# 2-agent team with plain generate() against generate() with a static KV cache, whose decode step transformers
# compiles (benchmarks/gpu/gpu_speed.py --static-cache), at batch 16 / 64 / 256, alternating, answers run to 64 tokens.
# Target: at least 3x generate()'s tokens/s at batch 16. No new wheels: transformers' own lever.
# On the GPU machine, from the repository root, with .whl carried as for gpu_speed.sh:
#   bash benchmarks/gpu/gpu_static_cache.sh
# On CPU, a toy-sized check of the script itself (no compile on CPU: transformers compiles only on CUDA):
#   SIZE=tiny BATCHES="4" RESPONSE_LENGTH=4 OUT=/tmp/static bash benchmarks/gpu/gpu_static_cache.sh
set -uo pipefail
START=$(date +%s)
BUDGET=${BUDGET:-330}
OUT=${OUT:-/tmp/gpu_static_cache}
SIZE=${SIZE:-0.5b}
BATCHES=${BATCHES:-"16 64 256"}
RESPONSE_LENGTH=${RESPONSE_LENGTH:-64}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PWD:/tmp/site"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 TRL_COLLM_CACHE=${TRL_COLLM_CACHE:-/tmp/trl_collm_models}
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo cpu) > "$OUT/device.txt"
python3 -c "from trl_collm.testing import tiny_model_dir; tiny_model_dir('$SIZE-qwen2', size='$SIZE')"
# --cb-config with no value: no continuous-batching column; the first (warm-up) call per batch size pays compilation.
python3 benchmarks/gpu/gpu_speed.py --size "$SIZE" --batches $BATCHES --response-length "$RESPONSE_LENGTH" \
  --static-cache --cb-config --deadline $(( START + BUDGET - 20 )) --json "$OUT/static_cache.json" \
  2>"$OUT/static_cache.err" | tee "$OUT/static_cache.txt"
echo "rc ${PIPESTATUS[0]} after $(( $(date +%s) - START ))s" | tee -a "$OUT/static_cache.txt"
