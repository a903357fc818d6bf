#!/usr/bin/env bash
# The README's two commands, as written, on a fresh clone of this checkout's HEAD, optionally beside N CPU-bound busy
# loops (issue 30: the test command must pass on a busy machine). Prints each command's exit status, wall/CPU time,
# peak memory and the load it ran at.
#   bash tools/fresh_clone_check.sh [N_BUSY_LOOPS=0] [CLONE_DIR=/tmp/trl-collm-fresh]
set -u
busy=${1:-0}
dir=${2:-/tmp/trl-collm-fresh}
src=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$dir" && git clone -q "$src" "$dir" && cd "$dir" || exit 1
pids=()
for _ in $(seq 1 "$busy"); do python3 -c 'while True: pass' & pids+=($!); done
trap 'kill "${pids[@]}" "$sampler" 2>/dev/null' EXIT
(while true; do cut -d' ' -f1 /proc/loadavg; sleep 30; done) > load.txt &
sampler=$!
export HF_HUB_OFFLINE=1
# The README's first two fenced commands (set-up + main job, set-up + tests), whatever they say today.
mapfile -t cmds < <(awk '/^```bash/{f=1; next} /^```/{if (f) exit} f && !/^#/ && NF' README.md)
status=0
for i in "${!cmds[@]}"; do
  rm -rf .venv
  /usr/bin/time -v bash -c "${cmds[$i]}" > "cmd$((i + 1)).log" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || status=1
  echo "command $((i + 1)): exit $rc; $(grep -E 'Elapsed' "cmd$((i + 1)).log" | sed 's/.*: //') wall;" \
    "$(awk -F': ' '/User time|System time/ {s += $2} END {printf "%.0f", s}' "cmd$((i + 1)).log") CPU s;" \
    "$(awk -F': ' '/Maximum resident/ {printf "%.1f GB", $2 / 1048576}' "cmd$((i + 1)).log") peak;" \
    "last line: $(grep -v '^\s' "cmd$((i + 1)).log" | grep -v '^$' | tail -1)"
done
sort -n load.txt | awk '{a[NR] = $1} END {if (NR) printf "1-minute load: median %s, max %s (%d samples)\n", a[int((NR + 1) / 2)], a[NR], NR}'
echo "logs: $dir/cmd*.log"
exit $status
