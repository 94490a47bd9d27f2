"""Races between a session's in-flight round and the end of its stream, on a real verifier on a
loopback socket with the real target runtime, whose forward pass the test can hold.

The scenario from the field: the edge gives up on a round (round timeout), cancels the stream
and re-opens the session on a new one while the old round is still queued or in the forward
pass. gRPC's termination callback then closes the old session from another thread. The round
must still finish on an intact cache, the table must keep charging that cache until the round
settles (nobody else may be given its room, nor evict it), and the re-opened session must get
exactly the verdict the round would have had.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence

import grpc
import pytest
import torch
from transformers import AutoTokenizer

from cloud.config import CloudConfig
from cloud.runtime.kv import KVState
from cloud.runtime.target import TargetRuntime
from cloud.server import CloudServer, create_server
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc
from waiting import wait_for

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

TIMEOUT = 20.0  # seconds any wait may take before the test fails instead of hanging
K = 4           # draft tokens per round


class HeldRuntime(TargetRuntime):
    """The real target runtime; after hold(), its next forward pass waits for let_go(), so a
    test can act while a round sits in (or queued behind) that pass."""

    def __init__(self, *args, **kwargs) -> None:
        self._armed = threading.Event()
        self._let_go = threading.Event()
        self.entered = threading.Event()
        super().__init__(*args, **kwargs)

    def hold(self) -> None:
        self._let_go.clear()
        self.entered.clear()
        self._armed.set()

    def let_go(self) -> None:
        self._let_go.set()

    def forward(self, batch: Sequence[tuple[KVState, Sequence[int]]]) -> list[torch.Tensor]:
        if self._armed.is_set():
            self._armed.clear()
            self.entered.set()
            assert self._let_go.wait(TIMEOUT), "the test never let the held pass go"
        return super().forward(batch)


@pytest.fixture(scope="module")
def runtime(target_dir) -> HeldRuntime:
    torch.set_num_threads(1)
    return HeldRuntime(target_dir, device="cpu")


@pytest.fixture(scope="module")
def prompts(target_dir, heldout_prompts) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    tokens = tokenizer("".join(heldout_prompts[:10]))["input_ids"]
    return [tokens[i * 50: i * 50 + 30] for i in range(3)]


@pytest.fixture(autouse=True)
def cloud_logs(caplog) -> None:
    caplog.set_level(logging.INFO, logger="cloud")  # the engine's per-session summary lines


def cloud_errors(caplog) -> list[str]:
    """What the verifier logged at ERROR (e.g. "session stream failed" and its traceback)."""
    return [r.getMessage() + (f" ({r.exc_info[1]!r})" if r.exc_info else "")
            for r in caplog.records if r.name.startswith("cloud") and r.levelno >= logging.ERROR]


@contextlib.contextmanager
def serving(runtime: TargetRuntime, kv_budget_bytes: int) -> Iterator[tuple[CloudServer, int]]:
    config = CloudConfig.model_validate({
        "server": {"host": "127.0.0.1", "port": 0, "shutdown_grace_s": 0.5},
        "limits": {"kv_budget_bytes": kv_budget_bytes, "max_draft_length": 8},
        "batch": {"window_ms": 0}})
    server, port = create_server(config, runtime=runtime)
    server.start()
    try:
        yield server, port
    finally:
        runtime.let_go()  # never leave the batcher's worker held
        server.stop(0.5).wait(10)


class Stream:
    """One Session call; send() does not wait, so a round can be left in flight."""

    def __init__(self, stub: pb_grpc.DecodingStub) -> None:
        self._requests: queue.Queue = queue.Queue()
        self.call = stub.Session(iter(self._requests.get, None), timeout=TIMEOUT)

    def send(self, **kind) -> None:
        self._requests.put(pb.ClientMessage(**kind))

    def recv(self) -> pb.ServerMessage:
        return next(self.call)

    def open(self, session_id: str, context: list[int], fingerprint: str) -> None:
        self.send(open=pb.Open(session_id=session_id, tokenizer_fingerprint=fingerprint,
                               context_ids=context))

    def draft(self, start: int, tokens: list[int], round_: int = 0) -> None:
        self.send(draft=pb.Draft(round=round_, start=start, tokens=tokens))

    def cancel(self) -> None:
        """What the edge does on a round timeout (SessionStream.abandon)."""
        self._requests.put(None)
        self.call.cancel()

    def close(self) -> None:
        self.send(close=pb.Close(reason="done"))
        self._requests.put(None)
        with contextlib.suppress(StopIteration, grpc.RpcError):
            next(self.call)


def ended(caplog, session_id: str) -> Callable[[], bool]:
    """The engine has logged the session's one summary line, i.e. closed it."""
    return lambda: any(r.name == "cloud.engine" and f"session {session_id} " in r.getMessage()
                       for r in caplog.records)


def block_for(context: list[int]) -> list[int]:
    return [(token * 7 + 11) % 1000 + 1 for token in context[-K:]]


def verdict_alone(stub, runtime, context: list[int], block: list[int]) -> pb.Verdict:
    stream = Stream(stub)
    stream.open("reference", context, runtime.fingerprint)
    assert stream.recv().HasField("opened")
    stream.draft(len(context), block)
    verdict = stream.recv().verdict
    stream.close()
    return verdict


def test_cancelled_mid_pass_round_finishes_charged_and_the_reopen_gets_its_verdict(
        runtime, prompts, caplog):
    context, other = prompts[0], prompts[1]
    block = block_for(context)
    bpt = runtime.bytes_per_token
    # Room for the session's round and not much more: the re-open and a third session need
    # the old round's room, which must not be handed out (nor evicted) while the round runs.
    budget = (len(context) + K + len(other) + 8) * bpt
    with serving(runtime, budget) as (server, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.DecodingStub(channel)
        expected = verdict_alone(stub, runtime, context, block)
        table = server.engine.table
        assert table.active == 0 and table.used_bytes == 0

        old = Stream(stub)
        old.open("edge-1", context, runtime.fingerprint)
        assert old.recv().HasField("opened")
        runtime.hold()
        old.draft(len(context), block)
        assert runtime.entered.wait(TIMEOUT), "the round never reached the forward pass"
        old.cancel()                                  # the edge's round timeout
        wait_for(ended(caplog, "edge-1"), "the old stream's session to be closed")
        # Closed, but its round still holds the cache it grew: charged until it settles.
        assert table.active == 1
        assert table.used_bytes == (len(context) + K) * bpt

        # The edge re-opens the same session on a new stream while the old round is held; a
        # third session arrives too. Neither may take the held round's room by evicting it.
        reopened, third = Stream(stub), Stream(stub)
        reopened.open("edge-1", context, runtime.fingerprint)
        wait_for(lambda: table.active == 2, "the re-open to be admitted")
        third.open("edge-2", other, runtime.fingerprint)
        wait_for(lambda: table.active == 3, "the third session to be admitted")
        assert table.evictions == 0 and table.used_bytes > budget  # over for a moment only

        runtime.let_go()
        assert reopened.recv().HasField("opened")
        assert third.recv().HasField("opened")
        # The old round settled and its session left the table with its charge.
        wait_for(lambda: table.active == 2, "the old session to leave the table")
        assert table.used_bytes == (len(context) - 1 + len(other) - 1) * bpt

        reopened.draft(len(context), block)
        reply = reopened.recv()
        assert reply.HasField("verdict"), reply
        assert (reply.verdict.accepted, reply.verdict.token) == (expected.accepted,
                                                                 expected.token)
        reopened.close()
        third.close()
        wait_for(lambda: table.active == 0, "every session to be closed")
        assert table.used_bytes == 0
    assert not cloud_errors(caplog)


def test_cancelled_round_queued_behind_another_pass_runs_on_an_intact_cache(
        runtime, prompts, caplog):
    mine, busy = prompts[0], prompts[2]
    bpt = runtime.bytes_per_token
    with serving(runtime, 10**8) as (server, port), \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.DecodingStub(channel)
        expected = verdict_alone(stub, runtime, mine, block_for(mine))
        table = server.engine.table

        blocker, old = Stream(stub), Stream(stub)
        blocker.open("blocker", busy, runtime.fingerprint)
        old.open("edge-1", mine, runtime.fingerprint)
        assert blocker.recv().HasField("opened") and old.recv().HasField("opened")
        held = table.used_bytes
        runtime.hold()
        blocker.draft(len(busy), block_for(busy))
        assert runtime.entered.wait(TIMEOUT)          # the worker is in the blocker's pass
        old.draft(len(mine), block_for(mine))         # ... so this round waits in the queue
        wait_for(lambda: table.used_bytes == held + (K + 1) * 2 * bpt,
                 "the queued round to reserve its room")
        old.cancel()
        wait_for(ended(caplog, "edge-1"), "the old stream's session to be closed")
        assert table.active == 2                      # still charged: its job is queued

        reopened = Stream(stub)
        reopened.open("edge-1", mine, runtime.fingerprint)
        runtime.let_go()
        assert blocker.recv().HasField("verdict")
        assert reopened.recv().HasField("opened")
        reopened.draft(len(mine), block_for(mine))
        reply = reopened.recv()
        assert (reply.verdict.accepted, reply.verdict.token) == (expected.accepted,
                                                                 expected.token)
        for stream in (blocker, reopened):
            stream.close()
        wait_for(lambda: table.active == 0 and table.used_bytes == 0, "every session to end")
    assert not cloud_errors(caplog)
