#!/usr/bin/env bash
# The prepared device check (issue 40): everything the GPU question needs, in <= 8 minutes on
# one CUDA GPU, every result to $OUT (default out/gpu-check): JSON, plots, summary.md.
#
#   scripts/gpu-check.sh          on a machine with CUDA
#   scripts/gpu-check.sh --cpu    the same steps at smoke size on the CPU (tests/bench/test_gpu_check.py)
#
# Steps, each under its own `timeout` (cap in seconds on CUDA; --cpu's smoke caps are looser,
# for a shared CPU), so a slow step never loses the others; steps.tsv has each one's exit
# status and time (124: its cap ran out):
#   identity         50  the verifier's batched path vs transformers' greedy generate on the
#                        device, 16 held-out prompts x 32 tokens (bench/passcost/identity.py)
#   tests            60  TANDEM_TEST_DEVICE=cuda pytest: the target runtime, the batched test,
#                        end-to-end greedy, and tests/models/test_family_conformance.py if present
#   surface-target   40  tandem pass-cost, the shipped target (float32, as it ships)
#   surface-llama-1b 50  tandem pass-cost, a random Llama-3.2-1B-shape target (bfloat16)
#   surface-llama-8b 90  tandem pass-cost, a random Llama-3.1-8B-shape target (bfloat16)
#                        (each surface: B 1..256 x n 1,2,4,6,8,12 x context 256, 1024, 5 reps;
#                        --max-seconds stops it in time and keeps what it measured)
#   verifier-bench   65  tandem verifier-bench at 64 and 256 sessions (one pass may hold 256),
#                        torch backend, against the same engine decoding alone
#   capacity         70  a short tandem capacity sweep (wifi/laptop, cloud-only and adaptive at
#                        16 and 64 users, 8 prompts, 4 s windows), the verifier on the device
#   paper-*      10 each tandem capacity --paper on each surface measured and the published one,
#                        calibrated on the committed CPU run, the engine fitted on
#                        verifier-bench's rows
#   summary          10  bench/passcost/summary.py -> summary.md
# The caps add up to 475 s on CUDA.
#
# Python: $PYTHON, else .venv/bin/python, else python3, with the project's dependencies
# (pyproject.toml) importable. A lent GPU machine's image has torch, transformers, grpcio, httpx
# and pyyaml but not all of them (pydantic, pydantic-settings, constriction, gguf, fastapi,
# llama-cpp-python for the drafts of the tests and capacity steps, ...): wheels for those in
# $WHEELS (default .whl, /work/.library/device/README.md says how to fetch them) are installed
# to /tmp/tandem-site first.
set -u
cd "$(dirname "$0")/.."
MODE=cuda
[ "${1:-}" = "--cpu" ] && MODE=cpu
OUT=${OUT:-out/gpu-check}
mkdir -p "$OUT"
: > "$OUT/steps.tsv"
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
WHEELS=${WHEELS:-.whl}
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/tandem-site "$WHEELS"/*.whl && export PYTHONPATH=/tmp/tandem-site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
CPU_SURFACE=docs/capacity/cpu-target-surface.json   # the committed capacity run's verifier

step() {  # step NAME CAP COMMAND...: run it capped, log to $OUT/NAME.log, record its status
    local name=$1 cap=$2 start rc
    shift 2
    start=$(date +%s)
    echo "[gpu-check] $name (cap ${cap} s)" >&2
    timeout -k 5 "$cap" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - start ))" "$cap" >> "$OUT/steps.tsv"
    [ "$rc" = 0 ] || echo "[gpu-check] $name: exit $rc (see $OUT/$name.log)" >&2
}

passcost() {  # passcost NAME CAP MAX_SECONDS ARGS...
    local name=$1 cap=$2 budget=$3
    shift 3
    step "surface-$name" "$cap" "$PY" -m bench.cli pass-cost --quiet --max-seconds "$budget" \
        --out "$OUT/surface-$name" "$@"
}

if [ "$MODE" = cuda ]; then
    DEV=(--device cuda)
    step identity 50 "$PY" -m bench.passcost.identity --device cuda --prompts 16 --tokens 32 \
        --json "$OUT/identity.json"
    TESTS=(tests/cloud/test_target_runtime.py tests/cloud/test_verify_batch.py tests/system/test_e2e_greedy.py)
    [ -f tests/models/test_family_conformance.py ] && TESTS+=(tests/models/test_family_conformance.py)
    step tests 60 env TANDEM_TEST_DEVICE=cuda "$PY" -m pytest -q -x -p no:cacheprovider "${TESTS[@]}"
    GRID=(--batches 1,2,4,8,16,32,64,128,256 --tokens 1,2,4,6,8,12 --contexts 256,1024 --reps 5)
    passcost target 40 32 "${DEV[@]}" --model models/tandem-target "${GRID[@]}" --probe 3
    passcost llama-1b 50 40 "${DEV[@]}" --shape llama-1b --dtype bfloat16 "${GRID[@]}" \
        --prefill-tokens 4096 --probe 0
    passcost llama-8b 90 75 "${DEV[@]}" --shape llama-8b --dtype bfloat16 "${GRID[@]}" \
        --prefill-tokens 4096 --probe 0
    step verifier-bench 65 "$PY" -m bench.cli verifier-bench --sessions 64,256 --rounds 4 --k 4 \
        --backends torch --max-batch 256 --json "$OUT/verifier-bench.json"
    step capacity 70 "$PY" -m bench.cli capacity --channel wifi --device laptop \
        --configs cloud-only,adaptive --users 16,64 --every-count --no-refine --warmup-s 2 \
        --window-s 4 --drain-s 5 --prompts 8 --cloud-set model.device=cuda --no-progress \
        --json "$OUT/capacity/capacity.json" --plots "$OUT/capacity"
    PAPER=(--max-batch 256 --context 1024)
else
    DEV=(--device cpu --threads 1)
    step identity 90 "$PY" -m bench.passcost.identity --device cpu --prompts 2 --tokens 4 \
        --json "$OUT/identity.json"
    printf 'tests\tskipped (--cpu: the suite runs them)\t0\t0\n' >> "$OUT/steps.tsv"
    SMOKE=(--batches 1,2 --tokens 1,3 --reps 1 --probe 0)
    passcost target 60 45 "${DEV[@]}" --model models/tandem-target "${SMOKE[@]}" --contexts 32
    passcost llama-1b 90 70 "${DEV[@]}" --shape llama-1b --layers 1 --vocab 4096 "${SMOKE[@]}" \
        --contexts 16 --prefill-tokens 64
    passcost llama-8b 90 70 "${DEV[@]}" --shape llama-8b --layers 1 --vocab 4096 \
        "${SMOKE[@]}" --contexts 16 --prefill-tokens 64
    step verifier-bench 120 "$PY" -m bench.cli verifier-bench --sessions 1 --rounds 1 --k 4 \
        --backends torch --speculative-only --json "$OUT/verifier-bench.json"
    step capacity 120 "$PY" -m bench.cli capacity --channel wifi --device laptop \
        --configs cloud-only --users 4 --no-refine --warmup-s 1 --window-s 2 --drain-s 5 \
        --prompts 2 --max-tokens 8 --no-progress \
        --json "$OUT/capacity/capacity.json" --plots "$OUT/capacity"
    PAPER=(--max-batch 64)
    PAPER_CAP=30  # 5-10 s each on this 2-core machine; on a slow day one took 10 s of 10
fi

for surface in "$OUT"/surface-*/surface.json bench/passcost/published/h100-7b.json; do
    [ -f "$surface" ] || continue
    name=$(basename "$(dirname "$surface")"); name=${name#surface-}
    [ "$name" = published ] && name=h100-7b-published
    ENGINE=()
    if [ -f "$OUT/verifier-bench.json" ] && [ -f "$OUT/surface-target/surface.json" ]; then
        ENGINE=(--engine-from "$OUT/verifier-bench.json"
                --engine-surface "$OUT/surface-target/surface.json")
    fi
    step "paper-$name" "${PAPER_CAP:-10}" "$PY" -m bench.cli capacity --paper "$surface" \
        --calibrate-on "$CPU_SURFACE" "${ENGINE[@]}" "${PAPER[@]}" --json "$OUT/paper-$name.json"
done

step summary 10 "$PY" -m bench.passcost.summary "$OUT"
cat "$OUT/summary.md"
# The check passes when every step that ran finished (a skipped step is not a failure).
! awk -F'\t' '$2 != "0" && $2 !~ /^skipped/' "$OUT/steps.tsv" | grep -q .
