#!/usr/bin/env bash
# docker-compose.yml for real: build the image, bring the stack up, check it, tear it down.
#
#   bash scripts/compose-check.sh        (root, or a user who may use the Docker engine)
#
# 1. A Docker engine: the one that answers, else (root only) `dockerd --iptables=false` started
#    here and left running for the next run. Compose: `docker compose` (v2) or `docker-compose` (v1).
# 2. The images of every service the stack starts, `docker build --network host`. The base is
#    python:3.11-slim where it can be pulled, else tandem-base:bookworm from Debian packages
#    (scripts/make-base-image.sh, made once) with TORCH_INDEX empty (torch from the wheels there).
#    Each image's size and its COPY of the project go in the summary; the check fails, naming
#    the folder, when an image holds a virtual environment, when the COPY holds much more than
#    git tracks (.dockerignore missed something), or when an image is past its budget. The builds
#    a new one took the tag from (dangling, one per commit checked) are removed.
# 3. The reference: the same models as plain processes from .venv (tandem-cloud serve +
#    tandem-edge serve on free loopback ports): 8 held-out prompts, greedy.
# 4. `up -d` with TANDEM_API_KEY (default services plus the scaleout profile's, the channel then
#    forwarding to its balancer); waits for every container of those services to be healthy;
#    the 8 prompts through the edge's published port with the key: each 100% verified and the
#    same text as the reference; the loadgen profile (0 errors); TANDEM_CHANNEL switched, the
#    channel recreated, its log must name the new profile and a request must verify through it.
# 5. Always (trap): `down -v --remove-orphans`, the reference processes stopped; then one summary
#    line on stdout. The images stay: a second run reuses their layers.
#
# Environment: TANDEM_BASE_IMAGE (skip the choice in 2), TANDEM_TORCH_INDEX (the Dockerfile's
# TORCH_INDEX), TANDEM_CHANNEL (first profile, default lte), TANDEM_CHECK_SWITCH_TO (default
# wifi), TANDEM_CHECK_PROFILES (default scaleout; empty for the default services alone),
# TANDEM_CLOUD_UPSTREAM (where the channel forwards), TANDEM_CHECK_VENV (default .venv, made by
# scripts/bootstrap.sh when missing), TANDEM_CHECK_PROJECT (compose project, default
# tandem-check), TANDEM_CHECK_HEALTH_TIMEOUT (600 s), TANDEM_CHECK_BUDGET (IMAGE=GB pairs, see
# BUDGETS), TANDEM_CHECK_KEEP_OLD_IMAGES=1 (keep the builds that lost their tag).
# Logs of every step: a folder under /tmp (outside the build context), named in the summary.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

PROJECT=${TANDEM_CHECK_PROJECT:-tandem-check}
VENV=${TANDEM_CHECK_VENV:-$ROOT/.venv}
HEALTH_TIMEOUT=${TANDEM_CHECK_HEALTH_TIMEOUT:-600}
export TANDEM_CHANNEL=${TANDEM_CHANNEL:-lte}
SWITCH_TO=${TANDEM_CHECK_SWITCH_TO:-wifi}
[[ $SWITCH_TO != "$TANDEM_CHANNEL" ]] || SWITCH_TO=lan
export TANDEM_API_KEY=${TANDEM_API_KEY:-check-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')}
# Profiles started with the default services (space-separated; unknown ones start nothing).
# Not here: monitoring (images from Docker Hub), vllm (a GPU), netem (a kernel with netem).
UP_PROFILES=()
for profile in ${TANDEM_CHECK_PROFILES-scaleout}; do UP_PROFILES+=(--profile "$profile"); done
ALL_PROFILES=(--profile loadgen "${UP_PROFILES[@]}")   # loadgen: run on its own, not by up
PROMPTS=8
MAX_TOKENS=48
LOGS=$(mktemp -d /tmp/tandem-compose-check.XXXXXX)
T0=$SECONDS
STEP=setup
SUMMARY=()
LOCAL_PIDS=()
STACK_UP=0

say() { echo "[compose-check +$((SECONDS - T0))s] $*" >&2; }
fail() { say "FAILED at $STEP: $*"; FAILURE="$*"; exit 1; }
step() { STEP=$1; say "$STEP"; }

finish() {
    local rc=$?
    trap - EXIT INT TERM
    for pid in "${LOCAL_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${LOCAL_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if (( STACK_UP )); then
        compose "${ALL_PROFILES[@]}" logs --no-color >"$LOGS/stack.log" 2>&1 || true
        (( rc == 0 )) || tail -n 60 "$LOGS/stack.log" >&2 || true
        compose "${ALL_PROFILES[@]}" down -v --remove-orphans --timeout 10 >"$LOGS/down.log" 2>&1 \
            || { rc=1; FAILURE=${FAILURE:-"down failed (see $LOGS/down.log)"}; }
        local label=label=com.docker.compose.project=$PROJECT left
        left=$( { docker ps -aq --filter "$label"; docker network ls -q --filter "$label";
                  docker volume ls -q --filter "$label"; } | wc -l)
        if (( left )); then
            rc=1; FAILURE=${FAILURE:-"$left containers/networks/volumes of $PROJECT left"}
        else
            SUMMARY+=("removed: containers, networks, volumes")
        fi
    fi
    local verdict="PASS in $((SECONDS - T0))s"
    (( rc == 0 )) || verdict="FAIL at $STEP after $((SECONDS - T0))s: ${FAILURE:-exit $rc}"
    printf 'compose-check: %s' "$verdict"; printf ' | %s' "${SUMMARY[@]}" "logs $LOGS"; echo
    exit "$rc"
}
trap finish EXIT
trap 'FAILURE="interrupted"; exit 130' INT TERM

step "docker engine"
if ! docker info >/dev/null 2>&1; then
    [[ $(id -u) == 0 ]] && command -v dockerd >/dev/null \
        || fail "no Docker engine answers, and only root can start dockerd here"
    setsid dockerd --iptables=false >/var/log/tandem-dockerd.log 2>&1 < /dev/null &
    say "started dockerd (pid $!, log /var/log/tandem-dockerd.log)"
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || fail "dockerd did not answer within 60 s (/var/log/tandem-dockerd.log)"
fi
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose); SEP=-
elif command -v docker-compose >/dev/null; then
    COMPOSE=(docker-compose); SEP=_
else
    fail "neither 'docker compose' (v2) nor 'docker-compose' (v1) is installed"
fi
compose() { "${COMPOSE[@]}" -p "$PROJECT" -f "$ROOT/docker-compose.yml" "$@"; }
SUMMARY+=("${COMPOSE[*]} $("${COMPOSE[@]}" version --short 2>/dev/null || echo '?')")

# ensure_venv: PY, the venv's python (scripts/bootstrap.sh makes .venv when it is missing).
ensure_venv() {
    if [[ ! -x $VENV/bin/tandem-cloud || ! -f tandem/v1/decoding_pb2.py ]]; then
        [[ $VENV == "$ROOT/.venv" ]] || fail "$VENV has no tandem-cloud"
        say "scripts/bootstrap.sh (log $LOGS/bootstrap.log)"
        bash scripts/bootstrap.sh >"$LOGS/bootstrap.log" 2>&1 || fail "scripts/bootstrap.sh failed ($LOGS/bootstrap.log)"
    fi
    PY=$VENV/bin/python
}
# The compose file is read with PyYAML: the system python's when it has it, so that the long
# image build starts before the venv is made.
YAML_PY=python3
python3 -c "import yaml" 2>/dev/null || { ensure_venv; YAML_PY=$PY; }

# send_prompts URL OUT.json N: N held-out prompts, greedy, one at a time (batching can reorder
# float sums; one at a time keeps both sides' arithmetic alike); fails unless each is 100% verified.
send_prompts() {
    "$PY" - "$@" "$MAX_TOKENS" <<'EOF'
import asyncio, json, os, sys
from pathlib import Path
from sim.workload import advertised_model, run_workload
from tandem.prompts import load_prompts
url, out, count, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
key = os.environ["TANDEM_API_KEY"]
prompts = load_prompts(Path("models/prompts/heldout.jsonl"), count)
records = asyncio.run(run_workload(url, advertised_model(url, api_key=key), prompts, max_tokens=max_tokens,
                                   concurrency=1, temperature=0.0, trace=False, api_key=key))
rows = [{"ok": r.ok, "error": r.error, "text": r.text, "tokens": r.completion_tokens,
         "verified_fraction": r.tandem.get("verified_fraction")} for r in records]
Path(out).write_text(json.dumps(rows, indent=1))
bad = [i for i, r in enumerate(rows) if not r["ok"] or r["verified_fraction"] != 1.0]
for i in bad:
    print(f"prompt {i}: ok={rows[i]['ok']} verified={rows[i]['verified_fraction']} {rows[i]['error']}", file=sys.stderr)
print(f"{count - len(bad)}/{count} prompts 100% verified ({sum(r['tokens'] for r in rows)} tokens)")
sys.exit(1 if bad else 0)
EOF
}

# wait_until SECONDS PID DESCRIPTION COMMAND...: poll COMMAND until it succeeds; PID must live.
wait_until() {
    local limit=$1 pid=$2 what=$3; shift 3
    for _ in $(seq "$limit"); do
        "$@" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || fail "$what exited (log in $LOGS)"
        sleep 1
    done
    fail "$what not ready within ${limit}s"
}

# Image budgets, GB (docker image inspect's Size), IMAGE=GB pairs. tandem:local measured 1.89 GB
# on the debootstrap base: base 0.38 (0.18 of it the torch wheel copied in), torch 0.87, the other
# wheels with llama.cpp 0.55, the checkout 0.08 (models 0.077). The budgets leave ~6% for
# dependency updates; a context with a virtual environment in it (3+ GB) or a compiler left in
# the image (0.4 GB) goes past. python:3.11-slim, where it can be pulled, is a smaller base.
BUDGETS=${TANDEM_CHECK_BUDGET:-tandem:local=2.0 tandem-balancer:local=0.5}
gb() { awk -v b="$1" 'BEGIN {printf "%.2f GB", b / 1e9}'; }
mb() { awk -v b="$1" 'BEGIN {if (b < 1e6) printf "%.1f kB", b / 1e3; else printf "%.0f MB", b / 1e6}'; }

# image_sizes IMAGE LOG: SIZES, "SIZE, COPY of the project C of a context X" for the summary. Fails,
# naming the folder, when the image holds a virtual environment (a pyvenv.cfg anywhere), when its
# COPY layers hold much more than git tracks, or when it is past its budget.
image_sizes() {
    local image=$1 log=$2 size own copy context venvs budget
    size=$(docker image inspect -f '{{.Size}}' "$image")
    # Its own layers (newest first, the base's below them): COPY/ADD ones are the project's files.
    own=$(( $(docker history -q "$image" | wc -l) - $(docker history -q "$BASE" | wc -l) ))
    copy=$(docker history --no-trunc --human=false --format '{{.Size}} {{.CreatedBy}}' "$image" \
        | awk -v own="$own" '{n = $1; sub(/^[0-9]+ +(\/bin\/sh -c #\(nop\) +)?/, "")}
                             (own <= 0 || NR <= own) && /^(COPY|ADD) / {s += n} END {print s + 0}')
    context=$(grep -oE '(Sending build context to Docker daemon|transferring context:) +[0-9.]+ ?[kMG]?B' "$log" \
        | awk 'END {print $NF}' || true)
    venvs=$(docker run --rm --user 0 --network none --entrypoint find "$image" / -xdev -name pyvenv.cfg -printf '%h ') \
        || fail "cannot look inside $image for virtual environments"
    [[ -z $venvs ]] || fail "$image holds a virtual environment: ${venvs% } ($(gb "$size"), COPY of the project $(mb "$copy")): leave it out of the build context (.dockerignore)"
    # The checkout is what git tracks (plus work not committed yet): a COPY well past it copied output.
    if (( TRACKED > 0 && copy > TRACKED * 5 / 4 + 16000000 )); then
        fail "$image: its COPY of the project is $(mb "$copy"), git tracks $(mb "$TRACKED"): .dockerignore misses what the build context sent (log $log)"
    fi
    budget=$(tr ' ' '\n' <<<"$BUDGETS" | awk -F= -v i="$image" '$1 == i {print $2}')
    if [[ -n $budget ]] && awk -v s="$size" -v b="$budget" 'BEGIN {exit !(s > b * 1e9)}'; then
        fail "$image is $(gb "$size"), past its budget of $budget GB (COPY $(mb "$copy"); TANDEM_CHECK_BUDGET)"
    fi
    SIZES="$(gb "$size")${budget:+ (budget $budget GB)}, COPY of the project $(mb "$copy")${context:+ of a $context context}"
}

# remove_old_builds IMAGE: the builds of IMAGE that a newer one took the tag from (one per commit
# the check ran on, each holding its own layers; earlier runs' too): dangling images with IMAGE's
# command and working folder, removed unless TANDEM_CHECK_KEEP_OLD_IMAGES=1 (one that a container
# uses stays). OLD: what the summary says of them.
remove_old_builds() {
    OLD=
    [[ ${TANDEM_CHECK_KEEP_OLD_IMAGES:-0} != 1 ]] || return 0
    local format='{{json .Config.Cmd}} {{.Config.WorkingDir}}' sig id removed=0
    sig=$(docker image inspect -f "$format" "$1")
    for id in $(docker images -q --no-trunc --filter dangling=true); do
        [[ $(docker image inspect -f "$format" "$id" 2>/dev/null) == "$sig" ]] || continue
        docker rmi "$id" >/dev/null 2>&1 && removed=$((removed + 1))
    done
    (( removed == 0 )) || OLD=", $removed older build(s) removed"
}

step "images"
BASE=${TANDEM_BASE_IMAGE:-}
if [[ -z $BASE ]]; then
    if docker image inspect python:3.11-slim >/dev/null 2>&1 \
            || timeout 90 docker pull python:3.11-slim >"$LOGS/pull.log" 2>&1; then
        BASE=python:3.11-slim
    else
        BASE=tandem-base:bookworm
        say "python:3.11-slim cannot be pulled: base $BASE from Debian packages, torch from its wheels"
        export TANDEM_TORCH_INDEX=${TANDEM_TORCH_INDEX-}
    fi
fi
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    [[ $BASE == tandem-base:* ]] || fail "base image $BASE not found"
    bash scripts/make-base-image.sh "$BASE" 2>"$LOGS/base-image.log" || fail "make-base-image.sh failed ($LOGS/base-image.log)"
fi
export TANDEM_BASE_IMAGE=$BASE   # for a compose file whose build args read it
compose "${ALL_PROFILES[@]}" config >"$LOGS/compose-config.yml" || fail "compose config failed"
# "service NAME" per service `up` starts (no profile, or one of UP_PROFILES), and for those and
# loadgen, when they have a build section, "build IMAGE CONTEXT DOCKERFILE ARG=VALUE...".
PLAN=$("$YAML_PY" - "$LOGS/compose-config.yml" "$PROJECT$SEP" "${UP_PROFILES[@]}" <<'EOF'
import sys, yaml
services = yaml.safe_load(open(sys.argv[1]))["services"]
up_profiles = set(sys.argv[4::2])
for name, svc in services.items():
    profiles = set(svc.get("profiles") or [])
    started = not profiles or bool(profiles & up_profiles)
    if not started and "loadgen" not in profiles:
        continue
    if started:
        print("service", name)
    build = svc.get("build")
    if build:
        build = {"context": build} if isinstance(build, str) else build
        args = build.get("args") or {}
        args = args if isinstance(args, dict) else dict(a.split("=", 1) for a in args)
        print("build", svc.get("image") or sys.argv[2] + name, build["context"],
              build.get("dockerfile", "Dockerfile"), *(f"{k}={v}" for k, v in args.items()))
EOF
) || fail "cannot read $LOGS/compose-config.yml"
SERVICES=$(awk '$1 == "service" {print $2}' <<<"$PLAN")
# With the scaleout profile's balancer up, the channel forwards to it (cloud and cloud-b behind
# it), so that the prompts cross every service the stack starts.
if grep -qx "service balancer" <<<"$PLAN"; then
    export TANDEM_CLOUD_UPSTREAM=${TANDEM_CLOUD_UPSTREAM:-balancer:50051}
fi
declare -A BUILT=()
TRACKED=$(git ls-files -z 2>/dev/null | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}') || true
while read -r kind image context dockerfile args; do
    [[ $kind == build && -z ${BUILT[$image]:-} ]] || continue
    BUILT[$image]=1
    build_args=(--build-arg "BASE_IMAGE=$BASE")
    for a in $args; do build_args+=(--build-arg "$a"); done
    [[ -z ${TANDEM_TORCH_INDEX+set} ]] || build_args+=(--build-arg "TORCH_INDEX=$TANDEM_TORCH_INDEX")
    [[ $dockerfile == /* ]] || dockerfile=$context/$dockerfile
    log=$LOGS/build-${image//[:\/]/_}.log
    say "building $image ($dockerfile on $BASE; log $log)"
    start=$SECONDS
    docker build --network host "${build_args[@]}" -f "$dockerfile" -t "$image" "$context" </dev/null >"$log" 2>&1 \
        || { tail -n 30 "$log" >&2; fail "docker build of $image failed ($log)"; }
    # Steps that make a layer: not FROM, nor an ARG before it (neither can come from the cache).
    steps=$(awk '/^Step [0-9]+\/[0-9]+ : / {if ($4 == "FROM") {from = 1; next}
                 if (from || $4 != "ARG") n++} /^#[0-9]+ \[/ {n++} END {print n + 0}' "$log")
    cached=$(grep -cE 'Using cache|CACHED' "$log" || true)
    remove_old_builds "$image"
    image_sizes "$image" "$log"
    SUMMARY+=("$image $SIZES built in $((SECONDS - start))s, $cached of $steps steps cached, base $BASE$OLD")
done <<<"$PLAN"

step "reference: plain processes"
ensure_venv
read -r CLOUD_PORT EDGE_PORT < <("$PY" -c "
import socket; s = [socket.socket() for _ in range(2)]
[x.bind(('127.0.0.1', 0)) for x in s]; print(*(x.getsockname()[1] for x in s))")
TANDEM_CLOUD_API_KEYS=$TANDEM_API_KEY "$VENV/bin/tandem-cloud" serve --config configs/cloud.yaml \
    --host 127.0.0.1 --port "$CLOUD_PORT" >"$LOGS/local-cloud.log" 2>&1 &
LOCAL_PIDS+=($!)
wait_until 180 "$!" "local tandem-cloud" "$PY" -c "
import grpc, sys; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g
r = g.HealthStub(grpc.insecure_channel('127.0.0.1:$CLOUD_PORT')).Check(h.HealthCheckRequest(service=''), timeout=3)
sys.exit(r.status != h.HealthCheckResponse.SERVING)"
"$VENV/bin/tandem-edge" serve --config configs/edge.yaml --host 127.0.0.1 --port "$EDGE_PORT" \
    --cloud "127.0.0.1:$CLOUD_PORT" >"$LOGS/local-edge.log" 2>&1 &
LOCAL_PIDS+=($!)
health() { "$PY" -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('$1/health', timeout=3).status != 200)"; }
wait_until 180 "$!" "local tandem-edge" health "http://127.0.0.1:$EDGE_PORT"
send_prompts "http://127.0.0.1:$EDGE_PORT" "$LOGS/local.json" "$PROMPTS" >"$LOGS/local-prompts.log" 2>&1 \
    || fail "the plain processes did not verify every prompt ($LOGS/local-prompts.log)"
for pid in "${LOCAL_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
LOCAL_PIDS=()

step "stack up"
if [[ -n $(docker ps -q --filter publish=8080) ]]; then
    fail "another container publishes port 8080 already: $(docker ps --filter publish=8080 --format '{{.Names}}')"
fi
STACK_UP=1
start=$SECONDS
compose "${UP_PROFILES[@]}" up -d --no-build >"$LOGS/up.log" 2>&1 || { tail -n 20 "$LOGS/up.log" >&2; fail "up -d failed ($LOGS/up.log)"; }

# all_healthy: every container of every default service running, and healthy where it has a check.
all_healthy() {
    local service id state pending=0
    for service in $SERVICES; do
        ids=$(compose "${UP_PROFILES[@]}" ps -q "$service")
        [[ -n $ids ]] || { pending=1; continue; }
        for id in $ids; do
            state=$(docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id")
            case $state in
                "running healthy" | "running none") ;;
                "running starting" | created*) pending=1 ;;
                *) fail "$service container ${id:0:12} is $state" ;;
            esac
        done
    done
    return "$pending"
}
for _ in $(seq $((HEALTH_TIMEOUT / 2))); do all_healthy && break; sleep 2; done
all_healthy || fail "not every service healthy within ${HEALTH_TIMEOUT}s"
SUMMARY+=("healthy in $((SECONDS - start))s: $(echo $SERVICES)")

step "held-out prompts through the edge"
EDGE_URL=http://$(compose port edge 8080 | tail -n 1)
send_prompts "$EDGE_URL" "$LOGS/stack.json" "$PROMPTS" >"$LOGS/stack-prompts.log" 2>&1 \
    || { cat "$LOGS/stack-prompts.log" >&2; fail "not every prompt verified through $EDGE_URL"; }
"$PY" - "$LOGS/local.json" "$LOGS/stack.json" <<'EOF' || fail "texts differ from the plain processes'"
import json, sys
local, stack = (json.load(open(p)) for p in sys.argv[1:3])
differ = [i for i, (a, b) in enumerate(zip(local, stack)) if a["text"] != b["text"]]
for i in differ:
    print(f"prompt {i}: local {local[i]['text']!r}\n          stack {stack[i]['text']!r}", file=sys.stderr)
sys.exit(1 if differ or len(local) != len(stack) else 0)
EOF
SUMMARY+=("$PROMPTS/$PROMPTS held-out prompts 100% verified over $TANDEM_CHANNEL${TANDEM_CLOUD_UPSTREAM:+ to $TANDEM_CLOUD_UPSTREAM}, identical to plain processes")

step "loadgen profile"
compose --profile loadgen run --rm -T loadgen >"$LOGS/loadgen.log" 2>&1 \
    || { tail -n 20 "$LOGS/loadgen.log" >&2; fail "loadgen reported errors ($LOGS/loadgen.log)"; }
# Its table (header, dashes, one "run" row) as "column value" pairs; cells are 2+ spaces apart.
SUMMARY+=("loadgen: $(awk -F '  +' '/^-+(  -+)*$/ {split(prev, h)} {prev = $0}
    $1 == "run" {for (i = 2; i <= NF; i++) if (h[i] ~ /^(req|errors|verified|verified tok\/s|tau)$/)
                     printf "%s%s %s", (n++ ? ", " : ""), h[i], $i}' "$LOGS/loadgen.log")")

step "channel $TANDEM_CHANNEL -> $SWITCH_TO"
FIRST=$TANDEM_CHANNEL
export TANDEM_CHANNEL=$SWITCH_TO
compose "${UP_PROFILES[@]}" up -d --no-build channel >"$LOGS/switch.log" 2>&1 || fail "recreating the channel failed ($LOGS/switch.log)"
for _ in $(seq 60); do all_healthy && break; sleep 2; done
all_healthy || fail "the stack is not healthy after the switch"
# Its command names the new profile file, and the emulator's first line says it loaded it.
# (Output goes to files before grep: `grep -q` closing a pipe early fails it under pipefail.)
for id in $(compose "${UP_PROFILES[@]}" ps -q channel); do
    docker inspect -f '{{json .Config.Cmd}}' "$id" >"$LOGS/channel-cmd.json"
    grep -qF "configs/channels/$SWITCH_TO.yaml" "$LOGS/channel-cmd.json" \
        || fail "channel ${id:0:12} runs $(cat "$LOGS/channel-cmd.json")"
    docker logs "$id" >"$LOGS/channel-$SWITCH_TO.log" 2>&1
    grep -qF "\"event\": \"listening\", \"profile\": \"$SWITCH_TO\"" "$LOGS/channel-$SWITCH_TO.log" \
        || fail "channel ${id:0:12} does not say it listens with profile $SWITCH_TO ($LOGS/channel-$SWITCH_TO.log)"
done
send_prompts "$EDGE_URL" "$LOGS/switched.json" 1 >"$LOGS/switched-prompts.log" 2>&1 \
    || { cat "$LOGS/switched-prompts.log" >&2; fail "no verified request through the $SWITCH_TO channel"; }
SUMMARY+=("channel $FIRST -> $SWITCH_TO applied and verifying")
step "teardown"
