#!/usr/bin/env bash
# Set up sapper in ./.venv (idempotent). Sourced by scripts/demo.sh and .ci/run.
# torch's CPU wheel goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! python -c "import torch" 2>/dev/null; then
  pip install -q "torch==${SAPPER_TORCH_VERSION:-2.13.0}" \
    || pip install -q --index-url https://download.pytorch.org/whl/cpu torch
fi
pip install -q -e ".[dev]"
