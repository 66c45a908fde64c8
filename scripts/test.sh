#!/usr/bin/env bash
# Set up sapper and run its test suite (the README's test command; CI runs it too).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
source "$ROOT/scripts/setup.sh"
cd "$ROOT"
python -m pytest -q "$@"
