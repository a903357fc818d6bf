#!/usr/bin/env bash
# Here (with a package index): download the wheels comlrl needs on the GPU machine, which has none.
#   bash benchmarks/vs_comlrl/fetch_gpu_wheels.sh      -> .whl-comlrl/ (git-ignored through .git/info/exclude)
# The GPU machine runs CPython 3.12 on x86-64; trl_collm's own wheels are in .whl/ (see docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl-comlrl/' .git/info/exclude 2>/dev/null || echo '/.whl-comlrl/' >> .git/info/exclude
mkdir -p .whl-comlrl
grep -v '^#' benchmarks/vs_comlrl/gpu_requirements.txt | grep . | while read -r req; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl-comlrl "$req"
done
ls .whl-comlrl | wc -l
du -sh .whl-comlrl
