#!/usr/bin/env bash
# The README's main command: set up .venv (idempotent) and run the local simulation
# (cloud verifier + link emulators + edge daemon on loopback, shipped tiny models).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/tandem sim "$@"
