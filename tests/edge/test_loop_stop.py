"""Stopping a generation: by on_tokens returning False (at the commit that returns it), or by
the caller's stop event, which ends a verdict wait or a reconnect backoff at once rather than
at the round timeout or the next commit. Real draft runtime, real gRPC on loopback; the silent
verifier is a fault injection (it opens sessions, then never answers a Draft)."""
from __future__ import annotations

import pytest
import socket
import threading
from concurrent import futures

import grpc
import torch
from verifier_harness import channel_to, client_for, open_draft
from verifier_harness import (edge_tokenizer, prompt_ids, reference,  # noqa: F401 (fixtures)
                              target_runtime, verifier)

from edge.request import GenerationRequest
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

torch.set_num_threads(1)

# Liveness bound of a stop: far below the round timeout / backoff the test sets (60 s), far
# above any scheduling delay on a loaded 2-core machine.
STOP_BOUND_S = 10.0


def test_on_tokens_returning_false_stops_at_that_commit(verifier, prompt_ids, draft_dir,
                                                        gguf_path, onnx_path):
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        client = client_for(channel_to(verifier), draft, draft_length=4)
        chunks: list[list[int]] = []

        def on_tokens(ids, verified):
            chunks.append(ids)
            return len(chunks) < 2

        result = client.generate(GenerationRequest(prompt_ids[0], 64), on_tokens=on_tokens)
        assert result.finish_reason == "cancelled"
        assert len(chunks) == 2 and result.token_ids == chunks[0] + chunks[1]
        assert result.rounds == 2 and len(result.rounds_log) == 2
        # the client is usable again right away
        again = client.generate(GenerationRequest(prompt_ids[0], 8))
        assert again.finish_reason == "length" and len(again.token_ids) == 8
    finally:
        draft.close()


class _Silent(pb_grpc.DecodingServicer):
    """Opens sessions like a verifier, then never answers (a hung server)."""

    def __init__(self) -> None:
        self.got_draft = threading.Event()
        self.release = threading.Event()

    def Session(self, request_iterator, context):
        for message in request_iterator:
            if message.WhichOneof("kind") == "open":
                yield pb.ServerMessage(opened=pb.Opened(session_id=message.open.session_id))
            elif message.WhichOneof("kind") == "draft":
                self.got_draft.set()
                self.release.wait(60)
                return


def test_stop_event_interrupts_a_verdict_wait(draft_dir, gguf_path, onnx_path, prompt_ids):
    silent = _Silent()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_DecodingServicer_to_server(silent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        client = client_for(channel_to(port), draft, round_timeout_s=60.0)
        stop = threading.Event()
        out: dict = {}
        worker = threading.Thread(target=lambda: out.update(result=client.generate(
            GenerationRequest(prompt_ids[0], 32), stop_event=stop)))
        worker.start()
        assert silent.got_draft.wait(30), "the client never sent a block"
        stop.set()
        worker.join(STOP_BOUND_S)
        assert not worker.is_alive(), "the stop did not end the verdict wait"
        result = out["result"]
        assert result.finish_reason == "cancelled" and result.token_ids == []
        assert result.rounds_log[-1].accepted is None  # sent, never answered
    finally:
        silent.release.set()
        server.stop(0)
        draft.close()


def test_stop_event_interrupts_a_reconnect_backoff(draft_dir, gguf_path, onnx_path, prompt_ids):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        # The first open is refused at once, then the loop would sleep 60 s before the next.
        channel = channel_to(port)
        refused = threading.Event()
        channel.subscribe(lambda state: state == grpc.ChannelConnectivity.TRANSIENT_FAILURE
                          and refused.set())
        client = client_for(channel, draft, retry_initial_backoff_s=60.0,
                            retry_max_backoff_s=60.0, offline_after_s=600.0, max_retries=5)
        stop = threading.Event()
        rounds: list = []
        out: dict = {}
        worker = threading.Thread(target=lambda: out.update(result=client.generate(
            GenerationRequest(prompt_ids[0], 32), on_round=rounds.append, stop_event=stop)))
        worker.start()
        assert refused.wait(30), "the first open was never refused"
        stop.set()  # the loop is in (or about to enter) its 60 s backoff
        worker.join(STOP_BOUND_S)
        assert not worker.is_alive(), "the stop did not end the backoff sleep"
        result = out["result"]
        assert result.finish_reason == "cancelled" and result.token_ids == [] and rounds == []
    finally:
        draft.close()
