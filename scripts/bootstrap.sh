#!/usr/bin/env bash
# Make (or refresh) the project's virtual environment at .venv/ and generate the protobuf code.
# Safe to run any number of times: each step is skipped when its inputs have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.tandem-install-stamp

if [ ! -x "$VENV/bin/python" ]; then
    echo "[bootstrap] creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi

want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
have=$(cat "$STAMP" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
    echo "[bootstrap] installing Python packages (first run: llama-cpp-python compiles llama.cpp, 5-9 minutes)"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # llama.cpp's multimodal tools are not needed; skipping them shortens the build.
    CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF}" \
        "$VENV/bin/python" -m pip install --quiet -e ".[test,llama]"
    echo "$want" > "$STAMP"
fi

proto=protos/tandem/v1/decoding.proto
generated=tandem/v1/decoding_pb2.py
if [ ! -f "$generated" ] || [ "$proto" -nt "$generated" ]; then
    echo "[bootstrap] generating protobuf code from $proto"
    "$VENV/bin/python" -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. --pyi_out=. "$proto"
fi
