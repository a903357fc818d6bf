#!/usr/bin/env bash
# Creates the separate virtualenv for comlrl (the paper's reference implementation) used by
# run_theirs.py. comlrl is NOT a dependency of trl_collm; it lives only in this venv.
#
#   bash benchmarks/compare/vs_comlrl/setup_env.sh            # -> benchmarks/compare/vs_comlrl/.venv-comlrl
#   PYTHON=python3.11 bash benchmarks/compare/vs_comlrl/setup_env.sh
#
# Order matters: torch first, pinned, so that comlrl's transformers requirement does not
# pull an unpinned (multi-GB CUDA) torch build. comlrl 1.4.3 itself declares no torch
# requirement; its other requirements (datasets, numpy, openai, packaging, pyyaml, tqdm,
# transformers>=4.30, wandb) install normally. TRL is not needed by comlrl 1.4.3.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-$HERE/.venv-comlrl}"
PY="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
COMLRL_SPEC="${COMLRL_SPEC:-comlrl==1.4.3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade pip >/dev/null
# The CPU wheel (local wheel dir / find-links, or the PyTorch CPU index) keeps the venv small.
"$VENV/bin/python" -m pip install "$TORCH_SPEC" \
  || "$VENV/bin/python" -m pip install "$TORCH_SPEC" --index-url https://download.pytorch.org/whl/cpu
"$VENV/bin/python" -m pip install "$COMLRL_SPEC"
# psutil is only used by the harness (optional); comlrl does not need it.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for p in ("comlrl", "torch", "transformers", "datasets", "numpy", "wandb"):
    try:
        print(f"{p}=={md.version(p)}")
    except md.PackageNotFoundError:
        print(f"{p}: not installed")
PY
