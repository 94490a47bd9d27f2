#!/usr/bin/env bash
# The README's test command: set up .venv and .venv-vllm (idempotent) and run the whole test
# suite. TANDEM_SKIP_VLLM=1 skips the vLLM environment (its tests then skip, saying why).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${TANDEM_SKIP_VLLM:-0}" = 1 ]; then
    bash scripts/bootstrap.sh
else
    bash scripts/bootstrap.sh --vllm
fi
exec .venv/bin/python -m pytest -q "$@"
