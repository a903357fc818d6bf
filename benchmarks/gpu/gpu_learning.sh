#!/usr/bin/env bash
# Issue 28 part 5: the learning tables at GPU scale, one command for a lent GPU machine (nothing to edit).
# The same scripts as on a CPU; on CUDA they train there (bf16 where the GPU has it) and run 4 jobs at once.
#   bash benchmarks/gpu/gpu_learning.sh [OUT_DIR]        # default outputs/gpu_learning
# Writes each table's runs, JSON and curves under OUT_DIR; an interrupted call continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-outputs/gpu_learning}"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this script is for a GPU machine'"
export OMP_NUM_THREADS=4
# Part 2: the writing table, CC / DC / MC x 3 seeds, both rates, the starting model re-sampled.
python benchmarks/research/real_findings.py writing-summary --jobs 4 --resample-seeds 1235 1236 \
  --out-dir "$out" --png-prefix "$out/real_findings"
# Part 4: the multi-turn tasks, the reward at the end: writing-revise (a draft, then a revision; CC / DC / MC x 3
# seeds) and code-humaneval (2 turns, test feedback; CC vs MC x 3 seeds at 128 env steps; needs bubblewrap).
python benchmarks/research/real_findings.py writing-revise --jobs 4 --resample-seeds 1235 1236 \
  --out-dir "$out" --png-prefix "$out/real_findings"
if command -v bwrap >/dev/null; then
  python benchmarks/research/real_findings.py code-humaneval --jobs 4 --seeds 0 1 2 --budget 128 \
    --out-dir "$out" --png-prefix "$out/real_findings"
else
  echo "bubblewrap missing: the code table (part 4) is skipped" >&2
fi
