"""Fault injection with real processes and sockets: the verifier (tandem-cloud serve, its own
process) is SIGSTOPped, SIGKILLed and restarted, restarted with another target; the link goes
through the link emulator with outages and loss; TLS and API keys are misconfigured; idle
streams try to hold every worker.

Each test checks, on top of its own bound:
- no lost or duplicated tokens: the chunks on_tokens saw concatenate to the final output;
- verified flags are right: every token marked verified is the target's greedy token after
  everything before it (one reference forward over prompt + output);
- the recovery bound it states (constants below).
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import torch
from raw_stream import Stream as RawStream
from verifier_harness import (channel_to, open_draft, start_verifier,  # noqa: F401 (fixtures)
                              edge_tokenizer, prompt_ids, reference, target_runtime)
from waiting import wait_for

from sim.netem import ChannelProfile, ChannelProxy
from bench.processes import cloud_info, free_port
from cloud.config import CloudConfig
from cloud.server import create_server
from edge.cli import main as edge_main
from edge.client import EdgeClient
from edge.request import GenerationRequest
from edge.link.errors import VerifierMisconfigured, VerifierUnavailable
from edge.config import ClientConfig, CloudLinkConfig
from edge.link import make_channel
from edge.link.monitor import LinkMonitor
from tandem.v1 import decoding_pb2 as pb

pytestmark = pytest.mark.e2e  # real verifier, daemon or processes end to end

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 1.0        # ClientConfig.deadline_floor_s: a verdict is late (probing starts)
STALL_S = 1.5           # ClientConfig.stall_timeout_s: no answer on the stream or to a probe
                        # this long and the link is down (edge/link/wait.py WaitRule)
PAUSE_MARGIN_S = 0.75   # drafting, scheduling on a loaded 2-core machine
RECOVERY_S = 2.0        # verifier answers again -> first verified token (monitor 0.1 s + open)
THROTTLE_S = 0.004      # per token: a consumer slow enough that generations outlast a fault


# --- the verifier as a process -------------------------------------------------------------------
class VerifierProcess:
    def __init__(self, log_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self, model: Path | None = None, timeout_s: float = 120.0) -> float:
        """Start (or restart) and wait until Info answers; returns that moment."""
        self.starts += 1
        argv = [str(Path(sys.executable).parent / "tandem-cloud"), "serve", "--host", "127.0.0.1",
                "--port", str(self.port), "--device", "cpu", "--log-level", "WARNING"]
        if model is not None:
            argv += ["--model", str(model)]
        log = (self.log_dir / f"verifier-{self.starts}.log").open("wb")
        env = {k: v for k, v in os.environ.items() if k != "TANDEM_CLOUD_API_KEYS"}
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                        env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.log_dir / f"verifier-{self.starts}.log"
                                                 ).read_text()[-2000:]
            with contextlib.suppress(grpc.RpcError):
                cloud_info(self.address, 0.5)
                return time.monotonic()
            time.sleep(0.05)
        raise TimeoutError("the verifier did not start")

    def signal(self, signum: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    """One verifier process for the module; the kill/restart test runs last (it leaves the
    draft model served)."""
    process = VerifierProcess(tmp_path_factory.mktemp("verifier"))
    process.start()
    yield process
    process.stop()


# --- the edge and what it saw --------------------------------------------------------------------
@dataclass
class Seen:
    """Every on_tokens chunk with its arrival time."""
    chunks: list[tuple[float, list[int], list[bool]]] = field(default_factory=list)
    verified_event: threading.Event = field(default_factory=threading.Event)
    local_event: threading.Event = field(default_factory=threading.Event)
    verified_goal: int = 40
    local_goal: int = 10**9

    def on_tokens(self, ids: list[int], verified: list[bool]) -> None:
        self.chunks.append((time.monotonic(), list(ids), list(verified)))
        flags = [v for _, _, vs in self.chunks for v in vs]
        if sum(flags) >= self.verified_goal:
            self.verified_event.set()
        if len(flags) - sum(flags) >= self.local_goal:
            self.local_event.set()
        time.sleep(THROTTLE_S * len(ids))

    def tokens(self) -> list[int]:
        return [t for _, ids, _ in self.chunks for t in ids]

    def flags(self) -> list[bool]:
        return [v for _, _, vs in self.chunks for v in vs]

    def longest_pause(self, since: float = 0.0) -> float:
        times = [t for t, _, _ in self.chunks if t >= since]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)

    def first_verified_after(self, moment: float) -> float | None:
        return next((t for t, _, vs in self.chunks if t >= moment and any(vs)), None)


def edge_client(address: str, draft, **config) -> tuple[EdgeClient, LinkMonitor]:
    """A client that goes on locally while the verifier is away (the default waits for it)
    and counts the link down after STALL_S without a sign of life."""
    config = {"offline": "continue", "stall_timeout_s": STALL_S, **config}
    channel = make_channel(CloudLinkConfig(), address)
    monitor = LinkMonitor(channel, address=address, tls=False, interval_up_s=0.25,
                          interval_down_s=0.1, timeout_s=0.5).start()
    client = EdgeClient(channel, draft, ClientConfig(draft_length=4, **config), monitor=monitor)
    return client, monitor


def check_tokens(seen: Seen, result, prompt: list[int], reference) -> None:
    """No lost or duplicated tokens; every verified token is the target's greedy token."""
    assert seen.tokens() == result.token_ids, "the streamed chunks differ from the output"
    assert seen.flags() == result.verified
    with torch.inference_mode():
        logits = reference.model(torch.tensor([prompt + result.token_ids])).logits[0]
    greedy = logits.argmax(-1).tolist()
    for i, (token, verified) in enumerate(zip(result.token_ids, result.verified)):
        if verified:
            assert token == greedy[len(prompt) + i - 1], f"token {i} marked verified is not " \
                                                          "the target's"


def run_in_thread(client: EdgeClient, request: GenerationRequest, seen: Seen):
    out: queue.Queue = queue.Queue()

    def work() -> None:
        try:
            out.put(client.generate(request, seen.on_tokens))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.put(exc)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return out


# --- the tests -----------------------------------------------------------------------------------
def test_sigstop_stall_continues_locally_and_resumes_verified(verifier, prompt_ids,
                                                              reference, draft_dir, gguf_path,
                                                              onnx_path):
    """A verifier that accepts connections but never answers: the stream never pauses longer
    than STALL_S + PAUSE_MARGIN_S, goes on locally (offline: continue), and is verified again
    within RECOVERY_S of SIGCONT, in the same generation."""
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    client, monitor = edge_client(verifier.address, draft)
    prompt = prompt_ids[170]
    seen = Seen(verified_goal=40, local_goal=120)
    try:
        out = run_in_thread(client, GenerationRequest(prompt, 500), seen)
        assert seen.verified_event.wait(60)
        verifier.signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        assert seen.local_event.wait(30), "no local tokens during the stall"
        verifier.signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        result = out.get(timeout=120)
        assert not isinstance(result, BaseException), result
    finally:
        monitor.stop()
        draft.close()
    check_tokens(seen, result, prompt, reference)
    assert len(result.token_ids) == 500
    first = seen.first_verified_after(resumed_at)
    print(f"SIGSTOP stall: longest pause {seen.longest_pause(since=stopped_at - 1):.2f} s, "
          f"verified again {first - resumed_at if first else float('nan'):.2f} s after SIGCONT, "
          f"{result.verified.count(False)} of 500 tokens unverified")
    assert seen.longest_pause(since=stopped_at - 1) <= STALL_S + PAUSE_MARGIN_S
    assert first is not None and first - resumed_at <= RECOVERY_S, \
        f"verification resumed {None if first is None else first - resumed_at:.2f} s after SIGCONT"
    assert not all(result.verified) and result.verified[-1]


def test_channel_outage_and_loss_go_local_and_come_back(target_runtime, prompt_ids, reference,
                                                        draft_dir, gguf_path, onnx_path):
    """The link emulator drops the link for 1 s (connections reset) with 2% loss around it:
    the stream goes on locally and is verified again within RECOVERY_S of the outage's end."""
    server, port = start_verifier(target_runtime, window_ms=0.0)
    profile = ChannelProfile(name="faulty", delay_ms=2.0, loss=0.02, loss_stall_ms=40.0,
                             outages=[{"start_s": 1.5, "duration_s": 1.0}])
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    prompt = prompt_ids[174]
    try:
        with ChannelProxy(profile, upstream=("127.0.0.1", port)) as proxy:
            started = time.monotonic()
            host, proxy_port = proxy.address
            client, monitor = edge_client(f"{host}:{proxy_port}", draft)
            seen = Seen()
            try:
                result = client.generate(GenerationRequest(prompt, 700), seen.on_tokens)
            finally:
                monitor.stop()
    finally:
        server.stop(0).wait()
        draft.close()
    check_tokens(seen, result, prompt, reference)
    assert len(result.token_ids) == 700
    outage_end = started + 2.5
    assert not all(result.verified), "the outage went unnoticed"
    first = seen.first_verified_after(outage_end)
    print(f"channel outage: {result.verified.count(False)} of 700 unverified, verified again "
          f"{first - outage_end if first else float('nan'):.2f} s after the outage, longest "
          f"pause {seen.longest_pause():.2f} s")
    assert first is not None and first - outage_end <= RECOVERY_S


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A server certificate + key, and an unrelated CA certificate."""
    directory = tmp_path_factory.mktemp("tls")
    paths = []
    for name in ("server", "other"):
        cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
        paths += [cert, key]
    return paths[0], paths[1], paths[2]


def test_tls_and_key_mismatches_fail_naming_the_cause(target_runtime, certificates, tmp_path,
                                                      draft_dir, gguf_path, capsys):
    cert, key, other_ca = certificates
    tls_server, tls_port = start_verifier(target_runtime, api_keys=("k",), tls=(cert, key))
    plain_server, plain_port = start_verifier(target_runtime, api_keys=("k",))

    def generate(port: int, *cloud: str) -> tuple[int, str]:
        config = tmp_path / "edge.yaml"
        config.write_text(
            f"cloud:\n  address: 127.0.0.1:{port}\n  api_key_env: ''\n" + "".join(
                f"  {line}\n" for line in cloud) +
            f"draft:\n  backend: llama.cpp\n  model_path: {gguf_path}\n"
            f"  tokenizer_dir: {draft_dir}\n  threads: 1\n")
        code = edge_main(["generate", "--config", str(config), "--prompt", "def f(x):\n",
                          "--max-tokens", "6"])
        return code, capsys.readouterr().err

    try:
        cases = [
            ("plaintext to TLS", generate(tls_port, "api_key: k"), "TLS mismatch"),
            ("unknown CA", generate(tls_port, "api_key: k", "tls: true",
                                    f"tls_root_cert: {other_ca}"), "TLS handshake failed"),
            ("TLS to plaintext", generate(plain_port, "api_key: k", "tls: true",
                                          f"tls_root_cert: {cert}"), "TLS handshake failed"),
            ("wrong key", generate(tls_port, "api_key: nope", "tls: true",
                                   f"tls_root_cert: {cert}"), "API key not accepted"),
            ("no key", generate(plain_port), "API key missing"),
        ]
        good = generate(tls_port, "api_key: k", "tls: true", f"tls_root_cert: {cert}")
    finally:
        tls_server.stop(0).wait()
        plain_server.stop(0).wait()
    for name, (code, err), cause in cases:
        assert code == 1, f"{name}: exit {code}: {err}"
        assert cause in err, f"{name}: {err}"
    assert good[0] == 0, good[1]


def test_idle_streams_cannot_starve_other_keys(target_runtime, prompt_ids, reference, draft_dir,
                                               gguf_path, onnx_path):
    """An attacker opens many silent streams: its key gets 2 (max_streams_per_key), the rest
    are refused at once, the 2 are closed by the Open deadline; another key's edge is verified
    throughout and equals the target alone."""
    server, port = start_verifier(target_runtime, api_keys=("attacker", "edge"),
                                  max_streams_per_key=2, open_timeout_s=1.0)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    prompt = prompt_ids[175]
    try:
        silent = [RawStream(channel, [("x-api-key", "attacker")]) for _ in range(6)]
        edge_channel = channel_to(port)
        monitor = LinkMonitor(edge_channel, (("x-api-key", "edge"),), interval_down_s=0.1).start()
        client = EdgeClient(edge_channel, draft, ClientConfig(draft_length=4),
                            metadata=(("x-api-key", "edge"),), monitor=monitor)
        seen = Seen()
        try:
            result = client.generate(GenerationRequest(prompt, 48), seen.on_tokens)
        finally:
            monitor.stop()
        codes = sorted(stream.end(close=False).name for stream in silent)
    finally:
        channel.close()
        server.stop(0).wait()
        draft.close()
    check_tokens(seen, result, prompt, reference)
    assert all(result.verified) and result.token_ids == reference.greedy(prompt, 48)
    assert codes == ["DEADLINE_EXCEEDED"] * 2 + ["RESOURCE_EXHAUSTED"] * 4


def test_overloaded_verifier_is_reported_as_such(target_runtime, prompt_ids, draft_dir,
                                                 gguf_path, onnx_path):
    """Every stream slot held: the edge's monitor says overloaded (not down), require_verified
    fails naming the overload instead of emitting unverified tokens."""
    config = CloudConfig.model_validate({
        "server": {"host": "127.0.0.1", "port": 0, "max_workers": 2, "shutdown_grace_s": 0},
        "model": {"path": str(target_runtime.model_dir), "device": "cpu"},
        "batch": {"window_ms": 0}})
    server, port = create_server(config, target_runtime)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        holders = [RawStream(channel) for _ in range(2)]
        for holder in holders:
            holder.send(pb.ClientMessage(open=pb.Open(
                tokenizer_fingerprint=target_runtime.fingerprint, context_ids=[1, 2])))
        client, monitor = edge_client(f"127.0.0.1:{port}", draft, offline="require_verified")
        try:
            with pytest.raises(VerifierUnavailable, match="verifier overloaded"):
                client.generate(GenerationRequest(prompt_ids[176], 16))
            assert monitor.state in ("overloaded", "up")
        finally:
            monitor.stop()
    finally:
        channel.close()
        server.stop(0).wait()
        draft.close()


def test_daemon_link_state_is_probed_and_a_cancelled_request_frees_its_slot_at_once(
        verifier, draft_dir, gguf_path):
    """/healthz says down from the start while the verifier is stalled (probed, not learnt from
    a request), up again within RECOVERY_S of SIGCONT; a client that disconnects while its
    round waits on a stalled verifier frees its pool slot within SLOT_FREED_S, well inside the
    verdict deadline."""
    import httpx

    from edge.config import DaemonConfig, EdgeConfig
    from edge.daemon.server import DaemonThread, load_pool
    from edge.runtime import DraftConfig

    slot_freed_s = 0.5
    config = EdgeConfig(
        cloud=CloudLinkConfig(address=verifier.address, api_key_env=""),
        draft=DraftConfig(backend="llama.cpp", model_path=gguf_path, tokenizer_dir=draft_dir,
                          n_ctx=1024, threads=1),
        client=ClientConfig(draft_length=4, monitor_interval_s=0.1, round_timeout_s=30.0,
                            deadline_floor_s=5.0),
        daemon=DaemonConfig(port=0, pool_size=1))

    def health(url: str) -> dict:
        return httpx.get(url + "/healthz", timeout=5).json()

    verifier.signal(signal.SIGSTOP)
    try:
        daemon = DaemonThread(load_pool(config)).start()
        first = health(daemon.url)
    finally:
        verifier.signal(signal.SIGCONT)
    try:
        assert first["link_state"] == "down" and "unreachable" in first["link_detail"], first
        wait_for(lambda: health(daemon.url)["link_state"] == "up", "the link up", RECOVERY_S)
        body = {"model": "tandem-draft", "prompt": "def f(x):\n", "max_tokens": 400,
                "temperature": 0, "stream": True, "ignore_eos": True}
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", daemon.url + "/v1/completions", json=body) as response:
                lines = response.iter_lines()
                for _ in range(3):
                    next(lines)
                verifier.signal(signal.SIGSTOP)   # the next verdict never comes
                time.sleep(0.2)                   # a round is waiting on it now
                assert health(daemon.url)["inflight"] == 1
                disconnected = time.monotonic()
            # Leaving the block closed the connection mid-stream.
        try:
            freed = wait_for(lambda: health(daemon.url)["inflight"] == 0, "the slot freed", 5.0)
        finally:
            verifier.signal(signal.SIGCONT)
        assert time.monotonic() - disconnected <= 5.0
        print(f"daemon: slot freed {freed:.3f} s after the disconnect")
        assert freed <= slot_freed_s, f"the slot was freed {freed:.2f} s after the disconnect"
    finally:
        daemon.stop()


def test_daemon_stream_flags_every_delta_through_a_stall(verifier, draft_dir, gguf_path,
                                                         reference, edge_tokenizer):
    """Each streamed content chunk says whether its text was verified and the link state. The
    verifier stalls after the first verified chunks and stays stalled: the stream goes on
    locally; the verified chunks form a prefix whose text is the target-alone text, every later
    chunk is unverified, and the unverified ones report the link down; the deltas concatenate to
    as many tokens as asked, and the final stats count the same unverified tokens."""
    import httpx

    from edge.config import DaemonConfig, EdgeConfig
    from edge.daemon.server import DaemonThread, load_pool
    from edge.runtime import DraftConfig

    config = EdgeConfig(
        cloud=CloudLinkConfig(address=verifier.address, api_key_env=""),
        draft=DraftConfig(backend="llama.cpp", model_path=gguf_path, tokenizer_dir=draft_dir,
                          n_ctx=1024, threads=1),
        client=ClientConfig(draft_length=4, monitor_interval_s=0.1, round_timeout_s=30.0,
                            deadline_floor_s=DEADLINE_S, stall_timeout_s=STALL_S,
                            offline="continue"),
        daemon=DaemonConfig(port=0, pool_size=1))
    prompt = "def f(x):\n"
    body = {"model": "tandem-draft", "prompt": prompt, "max_tokens": 300, "temperature": 0,
            "stream": True, "ignore_eos": True}
    chunks: list[dict] = []
    daemon = DaemonThread(load_pool(config)).start()
    try:
        with httpx.Client(timeout=60) as http, \
                http.stream("POST", daemon.url + "/v1/completions", json=body) as response:
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunks.append(json.loads(line[len("data: "):]))
                content = [c for c in chunks if c["choices"] and c["choices"][0]["text"]]
                if len(content) == 5:
                    verifier.signal(signal.SIGSTOP)   # every later round waits in vain
    finally:
        verifier.signal(signal.SIGCONT)
        daemon.stop()
    content = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
    stats = chunks[-1]["tandem"]
    flags = [c["tandem"]["verified"] for c in content]
    states = [c["tandem"]["link_state"] for c in content]
    first_local = flags.index(False)
    print(f"daemon stream: {len(content)} chunks, {first_local} verified then "
          f"{len(flags) - first_local} local; states of the local ones {sorted(set(states[first_local:]))}")
    assert first_local >= 5 and not any(flags[first_local:]), flags
    verified_text = "".join(c["choices"][0]["text"] for c in content[:first_local])
    target_ids = reference.greedy(edge_tokenizer.encode(prompt), 300)
    assert edge_tokenizer.decode(target_ids).startswith(verified_text)
    assert all(state == "up" for state in states[:first_local])
    assert "down" in states[first_local:]
    assert set(states) <= {"up", "degraded", "down"}
    assert stats["verified_tokens"] + stats["unverified_tokens"] == 300
    assert stats["unverified_tokens"] > 0 and stats["verified_tokens"] >= first_local


def test_keepalive_notices_a_silent_peer_with_no_call_in_flight(verifier):
    """A connection whose peer stops answering while the kernel still holds its socket (what a
    NAT that dropped the mapping, or a hung host, looks like; here SIGSTOP) is torn down by the
    edge channel's keepalive within keepalive_s + keepalive_timeout_s + 5 s, with
    no call in flight, so the next request does not wait on a dead connection."""
    from tandem.v1 import decoding_pb2_grpc as pb_grpc

    keepalive_s, timeout_s, margin_s = 10.0, 2.0, 5.0
    channel = make_channel(CloudLinkConfig(keepalive_s=keepalive_s, keepalive_timeout_s=timeout_s),
                           verifier.address)
    ready, left_ready = threading.Event(), threading.Event()

    def watch(state: grpc.ChannelConnectivity) -> None:
        if state == grpc.ChannelConnectivity.READY:
            ready.set()
        elif ready.is_set():
            left_ready.set()

    try:
        pb_grpc.DecodingStub(channel).Info(pb.InfoRequest(), timeout=10)
        channel.subscribe(watch)
        assert ready.wait(5), "the channel never reported READY"
        verifier.signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            noticed = left_ready.wait(keepalive_s + timeout_s + margin_s)
            took = time.monotonic() - stopped
        finally:
            verifier.signal(signal.SIGCONT)
        print(f"keepalive: the silent connection was dropped {took:.1f} s after the peer stopped")
        assert noticed, f"still READY {took:.1f} s after the peer stopped answering"
    finally:
        channel.unsubscribe(watch)
        channel.close()


def test_sigkill_restart_waits_verified_then_a_different_target_is_refused(
        verifier, prompt_ids, reference, draft_dir, gguf_path, onnx_path):
    """offline "wait": a verifier killed mid-stream and restarted on the same port; the stream
    pauses, then goes on verified within RECOVERY_S of the restarted verifier answering; every
    token is verified and equals the target alone. Then the verifier comes back serving the
    draft model (same tokenizer): the running generation is refused naming the new target, and
    a client pinning the target's digest refuses it from the start."""
    target_digest = cloud_info(verifier.address).target.digest
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    client, monitor = edge_client(verifier.address, draft, offline="wait", offline_wait_s=60)
    prompt = prompt_ids[171]
    try:
        seen = Seen(verified_goal=40)
        out = run_in_thread(client, GenerationRequest(prompt, 160), seen)
        assert seen.verified_event.wait(60)
        verifier.kill()
        killed_at = time.monotonic()
        up_at = verifier.start()
        result = out.get(timeout=120)
        assert not isinstance(result, BaseException), result
        check_tokens(seen, result, prompt, reference)
        assert all(result.verified) and result.token_ids == reference.greedy(prompt, 160)
        first = next(t for t, _, _ in seen.chunks if t > killed_at)
        print(f"SIGKILL + restart: paused {first - killed_at:.2f} s (restart took "
              f"{up_at - killed_at:.2f} s), resumed {first - up_at:.2f} s after it answered")
        assert first - up_at <= RECOVERY_S, f"resumed {first - up_at:.2f} s after restart"

        # The same port now serves another model with the same tokenizer.
        seen = Seen(verified_goal=20)
        out = run_in_thread(client, GenerationRequest(prompt_ids[172], 300), seen)
        assert seen.verified_event.wait(60)
        verifier.kill()
        verifier.start(model=draft_dir)
        refused = out.get(timeout=120)
        assert isinstance(refused, VerifierMisconfigured), refused
        assert "now serves tandem-draft" in str(refused)
        assert all(seen.flags()), "tokens were emitted unverified while waiting"
        pinned, pinned_monitor = edge_client(verifier.address, draft, target_digest=target_digest)
        try:
            with pytest.raises(VerifierMisconfigured, match=f"pins {target_digest}"):
                pinned.generate(GenerationRequest(prompt_ids[173], 8))
        finally:
            pinned_monitor.stop()
    finally:
        monitor.stop()
        draft.close()


def test_link_monitor_states_name_their_cause(target_runtime):
    """The monitor's probe (Info) tells up, down, misconfigured (key, pinned identity) apart."""
    server, port = start_verifier(target_runtime, api_keys=("k",))
    address = f"127.0.0.1:{port}"
    digest = cloud_info(address, metadata=(("x-api-key", "k"),)).target.digest
    cases = [((("x-api-key", "k"),), "", "up", ""),
             ((("x-api-key", "bad"),), "", "misconfigured", "API key not accepted"),
             ((), "", "misconfigured", "API key missing"),
             ((("x-api-key", "k"),), "sha256:" + "0" * 64, "misconfigured", "pins sha256:000")]
    try:
        for metadata, pin, state, cause in cases:
            channel = make_channel(CloudLinkConfig(), address)
            status = LinkMonitor(channel, metadata, pinned_digest=pin).probe()
            channel.close()
            assert (status.state, cause in status.detail) == (state, True), status
            if state == "up":
                assert digest[:19] in status.target
    finally:
        server.stop(0).wait()
    channel = make_channel(CloudLinkConfig(), address)
    status = LinkMonitor(channel, timeout_s=0.5).probe()
    channel.close()
    assert status.state == "down" and "unreachable" in status.detail


def test_link_monitor_names_a_tokenizer_or_model_mismatch(target_runtime):
    server, port = start_verifier(target_runtime)
    channel = make_channel(CloudLinkConfig(), f"127.0.0.1:{port}")
    try:
        wrong_tokenizer = LinkMonitor(channel, fingerprint="sha256:0").probe()
        wrong_model = LinkMonitor(channel, fingerprint=target_runtime.fingerprint,
                                  model="gpt-9").probe()
        right = LinkMonitor(channel, fingerprint=target_runtime.fingerprint,
                            model=target_runtime.name).probe()
    finally:
        channel.close()
        server.stop(0).wait()
    assert wrong_tokenizer.state == "misconfigured" and "tokenizer mismatch" in \
        wrong_tokenizer.detail
    assert wrong_model.state == "misconfigured" and "'gpt-9'" in wrong_model.detail
    assert right.state == "up"
