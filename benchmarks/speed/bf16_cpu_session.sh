#!/usr/bin/env bash
# Issue 45's targets in one command, for a CPU they have not been measured on (an Intel Xeon with AMX, an AVX2-only
# CPU). Run it on an otherwise idle machine; an interrupted call continues (finished steps leave their files and are
# skipped). bf16 steps run only where the CPU has native bf16 (avx512_bf16 / AMX): elsewhere bf16 is emulated and
# its figures would say nothing, so an AVX2-only CPU measures the float32 targets alone.
#   bash benchmarks/speed/bf16_cpu_session.sh          # ~1 h on a 2-core CPU with native bf16, ~1.5 h without
# 1. the CC workload against issue 28's baseline commit fc4554a, side by side in one sitting, float32 (and bf16),
#    with the FLOP count and the floor per phase, the update whole (micro-batch 8) and in micro-batches of 4
#    (targets: bf16 within 3x of its floor, float32 within 1.5x where bf16 is not native, peak <= 4 GB);
# 2. one decoding step of the two-adapter team, each CPU adaptation on and off (where the rollout's time goes);
# 3. MC (one agent) against TRL's GRPOTrainer on the real model, float32 (and bf16) (target: >= 1.5x per completion);
# 4. the README's example with its defaults, seeds 0 1 2, timed by /usr/bin/time (targets: learning beyond noise in
#    <= 5 min wall with native bf16, <= 10 without).
# It ends by printing the files to read; docs/benchmarks.md says how the figures on other CPUs were read.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$#" -gt 0 ]; then
  echo "this script takes no arguments (it measures what the CPU allows; see its header)" >&2
  exit 2
fi
dtypes="$(python - <<'EOF'
from trl_collm.hardware import cpu_description, cpu_has_native_bf16
import sys
print("CPU:", cpu_description(), file=sys.stderr)
print("fp32 bf16" if cpu_has_native_bf16() else "fp32")
EOF
)"
echo "measuring: $dtypes"
day="$(date +%F)"
out="outputs/bf16_cpu_session"
mkdir -p "$out"
baseline="$out/fc4554a"
if [ ! -d "$baseline/trl_collm" ]; then
  git cat-file -e fc4554a^{commit} || { echo "commit fc4554a is not in this clone (a shallow clone?)" >&2; exit 1; }
  mkdir -p "$baseline"
  git archive fc4554a | tar -x -C "$baseline"
fi
tag="$(python -c 'from trl_collm.hardware import cpu_has_native_bf16; print("native_bf16" if cpu_has_native_bf16() else "no_native_bf16")')"
bench="docs/data/bench_workload_cc_${tag}_vs_fc4554a_$day.json"
if [ ! -f "$bench" ]; then
  echo "== 1. the CC workload ($dtypes) against fc4554a, micro-batches 8 and 4 (~40-80 min)"
  # shellcheck disable=SC2086  # $dtypes is a list of words on purpose
  python benchmarks/speed/bench_workload.py --workload cc --compute $dtypes --against "$baseline" \
    --rounds 1 --warmup 1 --iterations 1 --batch 8 --micro-batch 8 4 --count-flops --json "$bench"
fi
decode="docs/data/bench_decode_step_${tag}_$day.json"
if [ ! -f "$decode" ]; then
  echo "== 2. one decoding step of the two-adapter team, each CPU adaptation on and off (~5 min)"
  # shellcheck disable=SC2086
  python benchmarks/speed/bench_decode_step.py --dtype $dtypes --rounds 2 --json "$decode"
fi
for dtype in $dtypes; do
  grpo="docs/data/vs_trl_mc_grpo_smollm2_${tag}_${dtype}_$day.json"
  if [ ! -f "$grpo" ]; then
    echo "== 3. MC (one agent) against TRL's GRPOTrainer on the real model, $dtype (~10 min)"
    python benchmarks/compare/vs_trl/mc_vs_grpo.py --model smollm2-135m-instruct --lora --dtype "$dtype" --steps 6 \
      --prompts 2 --group 4 --completion-length 24 --rounds 2 --sides ours trl --json "$grpo"
  fi
done
for seed in 0 1 2; do
  example_log="$out/example_seed${seed}_$day.log"
  if [ ! -f "$example_log" ]; then
    echo "== 4. the README's example, defaults, seed $seed (5-20 min)"
    /usr/bin/time -v python examples/smollm2_team.py --fresh --seed "$seed" --output-dir "$out/smollm2-team-$seed" \
      > "$example_log.partial" 2>&1
    mv "$example_log.partial" "$example_log"
    grep -E "held-out|paired|Elapsed|Maximum resident" "$example_log" || true
  fi
done
echo "done: $bench, $decode, docs/data/vs_trl_mc_grpo_smollm2_${tag}_*_$day.json, $out/example_seed*_$day.log"
