#!/usr/bin/env bash
# Here (with a package index): download the wheels the GPU machine needs, since it has no index of its own.
#   bash benchmarks/gpu/fetch_gpu_wheels.sh            -> .whl/         trl_collm's (benchmarks/gpu/gpu_requirements.txt)
#   bash benchmarks/gpu/fetch_gpu_wheels.sh --comlrl   -> also .whl-comlrl/  comlrl's (benchmarks/compare/vs_comlrl/gpu_requirements.txt)
# Both folders are git-ignored through .git/info/exclude and travel with `carry` (64 MiB in all: about 21 + 24 MB).
# The GPU machine runs CPython 3.12 on x86-64.
set -euo pipefail
cd "$(dirname "$0")/../.."
fetch() {  # fetch REQUIREMENTS_FILE TARGET_DIR
  grep -qx "/$2/" .git/info/exclude 2>/dev/null || echo "/$2/" >> .git/info/exclude
  mkdir -p "$2"
  grep -v '^#' "$1" | grep . | while read -r req; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$2" "$req" 2>/dev/null \
    || python3 -m pip wheel -q --no-deps -w "$2" "$req"  # sdist only (deepspeed): a pure-Python wheel, no ops built
  done
  echo "$2: $(ls "$2" | wc -l) wheels, $(du -sh "$2" | cut -f1)"
}
fetch benchmarks/gpu/gpu_requirements.txt .whl
if [ "${1:-}" = "--comlrl" ]; then
  fetch benchmarks/compare/vs_comlrl/gpu_requirements.txt .whl-comlrl
fi
