#!/usr/bin/env bash
# On the GPU machine (device tool), from the repository root, with .whl and .whl-comlrl carried:
#   bash benchmarks/compare/vs_comlrl/gpu_compare.sh
# 1. installs trl_collm's wheels into /tmp/site and comlrl's extra wheels into /tmp/site_comlrl (no index there);
# 2. measures the batching ceiling on the GPU (batching_ceiling.py);
# 3. runs the side-by-side comparison on CUDA (compare.py --device cuda), alternating the libraries run by run.
# Everything it writes goes to $OUT (the device tool's return folder), including a copy of
# docs/benchmarks_vs_comlrl.md with its GPU section filled; copy that and the JSON / PNG into docs/ afterwards.
# SIZES / SMALL_EPISODES / BIG_EPISODES / REPEATS override the defaults (small x2 at 128 episodes, 0.5b x1 at 64);
# PLAIN=1 adds the ours-plain runs (share_prompt_prefix=False), which the 10-minute device call leaves out by default.
set -euo pipefail
OUT=${OUT:-/tmp/vs_comlrl_gpu}
mkdir -p "$OUT"
pip_install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
pip_install /tmp/site .whl/*.whl
pip_install /tmp/site_comlrl .whl-comlrl/*.whl
export PYTHONPATH="$PWD:/tmp/site" HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
# comlrl runs under the same interpreter with its extra packages first on the path (its own "virtualenv").
printf '#!/bin/sh\nPYTHONPATH=/tmp/site_comlrl:%s exec python3 "$@"\n' "$PYTHONPATH" > /tmp/theirs-python
chmod +x /tmp/theirs-python
/tmp/theirs-python -c "import comlrl, wandb; print('comlrl', comlrl.__version__, 'wandb', wandb.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
SIZES=${SIZES:-"small 0.5b"}
python3 benchmarks/compare/vs_comlrl/batching_ceiling.py --device cuda --sizes $SIZES --threads 0 --models-dir /tmp/vs_models 2>&1 \
  | grep -v "^Loading\|it/s\]" | tee "$OUT/ceiling.txt"
cp docs/benchmarks_vs_comlrl.md "$OUT/"
python3 benchmarks/compare/vs_comlrl/compare.py --device cuda --sizes $SIZES --threads 0 \
  --small-repeats "${REPEATS:-2}" --small-episodes "${SMALL_EPISODES:-128}" \
  --episodes-for "0.5b=${BIG_EPISODES:-64}" "medium=${BIG_EPISODES:-64}" \
  --theirs-python /tmp/theirs-python --models-dir /tmp/vs_models --run-timeout 400 $([ "${PLAIN:-0}" = 1 ] || echo --no-plain) \
  --out-dir "$OUT" --doc "$OUT/benchmarks_vs_comlrl.md" 2>&1 | tee "$OUT/compare.log"
