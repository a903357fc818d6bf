#!/usr/bin/env bash
# Issue 28's measurements that only a CPU with native bf16 (avx512_bf16 / AMX) can make, one command, in the order
# they matter; an interrupted call continues (finished steps leave their files and are skipped).
#   bash benchmarks/speed/bf16_cpu_session.sh            # on a 2-core CPU with native bf16: ~1 h for steps 1-3
#   bash benchmarks/speed/bf16_cpu_session.sh --with-revise   # + step 4, the two-turn table (many hours: background it)
# 1. part 1's target: the CC workload, this tree in float32 and bf16 against issue 28's baseline commit fc4554a,
#    side by side in one sitting, with the FLOP count and its floor (docs/benchmarks.md, "The arithmetic floor"),
#    the update whole (micro-batch 8: fastest) and in micro-batches of 4 (issue 45's <= 4 GB);
# 2. part 2's one missing cell: MC at lr 1e-3, seed 0, 128 env steps (bf16);
# 3. part 3: the README's example with its defaults, timed (its bf16 figure predates float32 attention under autocast);
#    then issue 45's decoding step (prepacked weights against `unpacked`) and the MC vs TRL GRPOTrainer pair in bf16;
# 4. part 4 (--with-revise): writing-revise, CC and MC x 3 seeds at lr 3e-3.
# Refuses to run elsewhere: on an AVX2-only CPU bf16 is emulated (~1 GFLOP/s) and every bf16 figure would be wrong.
set -euo pipefail
cd "$(dirname "$0")/../.."
with_revise=0
for arg in "$@"; do
  case "$arg" in
    --with-revise) with_revise=1 ;;
    *) echo "unknown argument: $arg (the only one is --with-revise)" >&2; exit 2 ;;
  esac
done
python - <<'EOF'
import sys
from trl_collm.hardware import cpu_description, cpu_has_native_bf16
print("CPU:", cpu_description())
if not cpu_has_native_bf16():
    sys.exit("this CPU has no native bf16: these measurements need avx512_bf16 or AMX (see the script's header)")
EOF
day="$(date +%F)"
out="outputs/bf16_cpu_session"
mkdir -p "$out"
baseline="$out/fc4554a"
if [ ! -d "$baseline/trl_collm" ]; then
  git cat-file -e fc4554a^{commit} || { echo "commit fc4554a is not in this clone (a shallow clone?)" >&2; exit 1; }
  mkdir -p "$baseline"
  git archive fc4554a | tar -x -C "$baseline"
fi
bench="docs/data/bench_workload_cc_native_bf16_flops_$day.json"
if [ ! -f "$bench" ]; then
  echo "== 1. the CC workload, fp32 and bf16, against fc4554a, the update whole and in 2 micro-batches (~80 min)"
  python benchmarks/speed/bench_workload.py --workload cc --compute fp32 bf16 --against "$baseline" \
    --rounds 1 --warmup 1 --iterations 1 --micro-batch 8 4 --count-flops --json "$bench"
fi
echo "== 2. the writing table's missing cell: MC, lr 1e-3, seed 0 (~15 min)"
python benchmarks/research/real_findings.py writing-summary --methods mc --seeds 0 --lrs 0.001 --compute bf16
example_log="$out/example_$day.log"
if [ ! -f "$example_log" ]; then
  echo "== 3. the README's example, defaults (~8 min)"
  python examples/smollm2_team.py --output-dir "$out/smollm2-team" 2>&1 | tee "$example_log.partial"
  mv "$example_log.partial" "$example_log"
fi
decode="docs/data/bench_decode_step_native_bf16_$day.json"
if [ ! -f "$decode" ]; then
  echo "== 3b. one decoding step of the two-adapter team, bf16, each CPU adaptation on and off (~5 min)"
  python benchmarks/speed/bench_decode_step.py --dtype bf16 --rounds 2 --json "$decode"
fi
grpo="docs/data/vs_trl_mc_grpo_smollm2_native_bf16_$day.json"
if [ ! -f "$grpo" ]; then
  echo "== 3c. MC (one agent) against TRL's GRPOTrainer on the real model, bf16 (~10 min)"
  python benchmarks/compare/vs_trl/mc_vs_grpo.py --model smollm2-135m-instruct --lora --dtype bf16 --steps 6 \
    --prompts 2 --group 4 --completion-length 24 --rounds 2 --sides ours trl --json "$grpo"
fi
if [ "$with_revise" = 1 ]; then
  echo "== 4. writing-revise, CC and MC x 3 seeds (hours; resumes)"
  python benchmarks/research/real_findings.py writing-revise --methods cc mc --seeds 0 1 2 --lrs 0.003 --compute bf16 \
    --jobs 2 --resample-seeds 1235
fi
echo "done: $bench, $decode, $grpo, docs/data/real_findings/, $example_log"
