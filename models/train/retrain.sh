#!/usr/bin/env bash
# Retrain the whole shipped model family from the interpreter's stdlib sources.
# Each step resumes or skips when its output exists; delete models/.cache to start over.
#   bash models/train/retrain.sh [SEED] [TARGET_MINUTES] [DRAFT_MINUTES] [SMALL_MINUTES]
set -euo pipefail
cd "$(dirname "$0")/../.."
SEED=${1:-0}; TARGET_MIN=${2:-55}; DRAFT_MIN=${3:-30}; SMALL_MIN=${4:-25}
PY=.venv/bin/python
[ -f models/tokenizer/tokenizer.json ] || $PY -m models.train.tokenizer --out models/tokenizer
$PY -c "from pathlib import Path; from models.train import data; data.write_heldout_list(Path('models/heldout_files.txt'))"
$PY -m models.train.prompts
$PY -m models.train.train --role target --minutes "$TARGET_MIN" --seed "$SEED"
$PY -m models.train.train --role draft --teacher models/tandem-target --minutes "$DRAFT_MIN" --seed "$SEED"
# The ladder's middle rung: starts as the target with layers 0, 3, 7 kept, then distilled;
# 1 thread, shorter sequences (more steps in its budget), fp16 weights on disk (80 MB cap).
$PY -m models.train.train --role small --teacher models/tandem-target --minutes "$SMALL_MIN" --seed "$SEED" \
    --init-from models/tandem-target --init-layers 0,3,7 --lr 1e-3 --warmup 20 \
    --threads 1 --seq 256 --checkpoint-every 25 --save-dtype float16
for m in tandem-draft tandem-small; do
    $PY -m models.export.gguf --hf models/$m
    $PY -m models.export.onnx --hf models/$m
done
# The coded q's id prior (tandem/qpriors/); it prints the count / step models for
# tandem/qcodec.py too (a new prior changes the codec's name: peers negotiate it, never misread).
$PY -m models.train.q_prior
$PY -m models.train.evaluate
$PY -m models.train.evaluate --draft models/tandem-small --json models/evaluation-small.json
$PY -m bench.runtimes --json models/runtimes.json
$PY -m models.train.card
