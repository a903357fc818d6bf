#!/usr/bin/env bash
# One GPU sitting for issue 16, under 7 minutes, everything written to $OUT (the device tool's return folder):
#   1. rollout tokens/s of the 0.5B 2-agent team, continuous batching vs generate(), batch 16 / 64 / 256
#      (benchmarks/gpu/gpu_speed.py -> rollout.json);
#   2. one 0.5B CC team iteration, plain vs DeepSpeed ZeRO-3 with one process (benchmarks/gpu/gpu_team.py ->
#      team.jsonl; 1 warm-up + 2 timed iterations each);
#   3. if at least COMPARE_MIN_S seconds are left: benchmarks/compare/vs_comlrl/gpu_compare.sh at a reduced size (needs
#      .whl-comlrl carried too), cut off at the time limit.
# On the GPU machine, from the repository root, with .whl (and .whl-comlrl) carried:
#   bash benchmarks/gpu/gpu_speed.sh
# On CPU, a toy-sized check of the script itself (no wheels needed when the packages are installed):
#   SIZE=tiny BATCHES="4 8" RESPONSE_LENGTH=8 TEAM_BATCH=4 OUT=/tmp/gpu_speed bash benchmarks/gpu/gpu_speed.sh
set -uo pipefail
START=$(date +%s)
BUDGET=${BUDGET:-400}            # seconds for the whole script (the lead's device call allows 7 minutes)
OUT=${OUT:-/tmp/gpu_speed}
SIZE=${SIZE:-0.5b}
BATCHES=${BATCHES:-"16 64 256"}
RESPONSE_LENGTH=${RESPONSE_LENGTH:-64}
TEAM_BATCH=${TEAM_BATCH:-16}
COMPARE_MIN_S=${COMPARE_MIN_S:-150}
mkdir -p "$OUT"
left() { echo $(( START + BUDGET - $(date +%s) )); }
log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/steps.log"; }

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PWD:/tmp/site"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 TRL_COLLM_CACHE=${TRL_COLLM_CACHE:-/tmp/trl_collm_models}
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo cpu) > "$OUT/device.txt"
python3 -c "import torch, transformers, trl, deepspeed; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'deepspeed', deepspeed.__version__)" \
  2>/dev/null | tee "$OUT/versions.txt"
date -u +%Y-%m-%dT%H:%M:%SZ > "$OUT/date.txt"
# Build the models once before anything is timed (the factory writes them into $TRL_COLLM_CACHE).
python3 -c "from trl_collm.testing import tiny_model_dir; tiny_model_dir('$SIZE-qwen2', size='$SIZE')"
log "models ready"

# 1. rollout: continuous batching vs generate(); starts no batch it expects to end after START+BUDGET-210 (the
#    plain and ZeRO-3 runs below need about 110 s for the 0.5B team)
# Columns: generate(), continuous batching with TRL's defaults, and the same without CUDA graphs (each call builds
# its own paged cache and, with graphs, captures them again: the second column shows what that costs).
python3 benchmarks/gpu/gpu_speed.py --size "$SIZE" --batches $BATCHES --response-length "$RESPONSE_LENGTH" \
  --cb-config '{}' '{"use_cuda_graph": false}' \
  --deadline $(( START + BUDGET - 210 )) --json "$OUT/rollout.json" 2>"$OUT/rollout.err" | tee "$OUT/rollout.txt"
log "rollout done (rc ${PIPESTATUS[0]})"

# 2. plain vs ZeRO-3, one process each; each run gets at most half of what is left after keeping 20 s spare
for mode in plain zero3; do
  share=1; [ "$mode" = plain ] && share=2
  limit=$(( ($(left) - 20) / share ))
  if [ "$limit" -lt 30 ]; then log "skipping $mode: ${limit}s left"; continue; fi
  if [ "$mode" = plain ]; then
    cmd=(python3 benchmarks/gpu/gpu_team.py)
  else
    cmd=(python3 -m accelerate.commands.launch --num_processes 1 --config_file trl_collm/accelerate_configs/zero3.yaml benchmarks/gpu/gpu_team.py)
  fi
  timeout "$limit" "${cmd[@]}" --size "$SIZE" --batch "$TEAM_BATCH" --response-length "$RESPONSE_LENGTH" --iterations 2 \
    --out "/tmp/gpu_team_$mode" 2>"$OUT/team_$mode.err" | grep '^{"' | tee -a "$OUT/team.jsonl"
  log "$mode done (rc ${PIPESTATUS[0]}, limit ${limit}s)"
done

# 3. the comlrl comparison, reduced, only if there is time (it is cut off at the budget either way)
if [ "$(left)" -ge "$COMPARE_MIN_S" ] && ls .whl-comlrl/*.whl >/dev/null 2>&1; then
  log "vs_comlrl with $(left)s left"
  OUT="$OUT/vs_comlrl" SIZES=${COMPARE_SIZES:-small} REPEATS=1 SMALL_EPISODES=64 \
    timeout $(( $(left) - 5 )) bash benchmarks/compare/vs_comlrl/gpu_compare.sh > "$OUT/vs_comlrl.log" 2>&1
  log "vs_comlrl done (rc $?)"
else
  log "vs_comlrl skipped ($(left)s left; needs ${COMPARE_MIN_S}s and .whl-comlrl)"
fi
log "finished"
