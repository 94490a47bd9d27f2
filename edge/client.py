"""The edge session client: `EdgeClient.generate(request, on_tokens, on_round, stop_event)`.

It wires the parts of a generation together and owns nothing else (vocabulary:
protos/tandem/v1/decoding.proto):
- edge/link/         the verifier link: open, send a block without waiting, await its verdict,
                     byte counting, error classes (outage / overload / refusal), reconnects,
                     the offline policy and the link monitor;
- edge/generation.py the round loop: ask the policy, draft, send, apply the verdict, record
                     (one executor per kind of round in edge/rounds/);
- edge/control/      the draft policies (fixed k, adaptive, peers' rules), chosen by
                     `client.policy` in the config;
- edge/record.py     the per-round log and the GenerationResult derived from it.
"""
from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Mapping, Sequence

import grpc

from edge.config import DEFAULT_DRAFTER, ClientConfig
from edge.control.entropy import EntropySwitch
from edge.control.policy import DraftPolicy, FixedK, make_policy
from edge.drafting import DraftCursor
from edge.fast_calibration import FastCalibration
from edge.generation import Generation
from edge.link import VerifierLink
from edge.link.monitor import LinkMonitor
from edge.link.offline import OfflineControl
from edge.record import GenerationResult
from edge.request import GenerationRequest
from edge.runtime.base import DraftRuntime
from edge.state import OnRound, OnTokens
from tandem.qcodec import codec_for
from tandem.v1 import decoding_pb2_grpc as pb_grpc

class EdgeClient:
    """Runs generations against one verifier over `channel` with one draft runtime, or a ladder
    of them: `draft` (named "draft") plus `drafters` by name, cheapest first; the policy's
    Plan.drafter picks the one that drafts each block.

    Not thread-safe: one generation at a time per client (each runtime has one KV cache). The
    policy lives as long as the client, so what it learns carries over between generations.
    """

    def __init__(self, channel: grpc.Channel, draft: DraftRuntime, config: ClientConfig,
                 metadata: Sequence[tuple[str, str]] = (),
                 policy: DraftPolicy | None = None,
                 drafters: Mapping[str, DraftRuntime] | None = None,
                 monitor: LinkMonitor | None = None,
                 calibration: FastCalibration | None = None) -> None:
        """monitor: the link monitor shared by this process's clients (edge/link/monitor.py);
        with it, a returning verifier is used as soon as it answers, and a misconfigured link
        fails the request naming the cause."""
        self.stub = pb_grpc.DecodingStub(channel)
        self.draft = draft
        self.config = config
        self.metadata = tuple(metadata)
        # One cursor per local model: each knows what its runtime's cache holds, so switching
        # rungs rolls back and feeds only what that rung missed (DraftCursor.sync).
        self.cursors = {DEFAULT_DRAFTER: DraftCursor(draft),
                        **{name: DraftCursor(rt) for name, rt in (drafters or {}).items()}}
        self.cursor = self.cursors[DEFAULT_DRAFTER]
        self.policy = policy if policy is not None else make_policy(config.policy, config)
        if not isinstance(self.policy, DraftPolicy):
            raise TypeError(f"{type(self.policy).__name__} is no DraftPolicy: a policy subclasses "
                            "edge.control.policy.DraftPolicy (its capabilities' defaults)")
        self.jitter_rng = random.Random()  # unseeded: edges must not retry in lockstep
        self.monitor = monitor
        self._fast_policy: DraftPolicy | None = None  # built on the first fast request
        # fast mode's agreement calibration (shared by a daemon's clients; else this client's)
        self.calibration = calibration if calibration is not None \
            else FastCalibration.from_config(config.fast)
        # The coded q format this client offers verifiers (None: plain SparseDistributions).
        self.q_codec = (codec_for(draft.fingerprint(), draft.vocab_size)
                        if config.q_codec == "entropy" else None)

    def generate(self, request: GenerationRequest, on_tokens: OnTokens | None = None,
                 on_round: OnRound | None = None,
                 stop_event: threading.Event | None = None) -> GenerationResult:
        """Generate up to request.max_tokens new tokens. on_tokens(ids, verified) is called
        with every committed chunk as it is committed (returning False stops the generation);
        on_round(record) after every round; setting stop_event stops it at once. A stopped
        generation returns what it committed, with finish_reason "cancelled"."""
        request = request.resolved(self.config)  # checked when built; defaults filled here
        mode = request.mode
        offline = OfflineControl(self.config, self.monitor, request.offline,
                                 request.offline_wait_s)
        policy = self._policy_for(request, fast=mode == "fast")
        link = VerifierLink(self.stub, self.metadata, session_id=uuid.uuid4().hex,
                            target_model=self.config.target_model,
                            fingerprint=self.draft.fingerprint(), sampling=request.sampling,
                            fast=mode == "fast", pinned_digest=self.config.target_digest,
                            offered_codec=self.q_codec)
        try:
            return Generation(request=request, cursor=self.cursor,
                              config=self.config, policy=policy, link=link,
                              on_tokens=on_tokens, on_round=on_round, stop_event=stop_event,
                              jitter_rng=self.jitter_rng, cursors=self.cursors,
                              fast=mode == "fast",
                              max_unverified_run=request.max_unverified_run, offline=offline,
                              calibration=self.calibration,
                              min_agreement=request.min_agreement).run()
        finally:
            offline.close()

    def _policy_for(self, request: GenerationRequest, fast: bool) -> DraftPolicy:
        """The client's policy; a fixed k when the request names one. Fast mode needs a policy
        that marks skippable blocks (the entropy switch): under any other client.policy a
        fast request gets this client's own entropy switch, so "fast" never silently means
        lossless."""
        if fast:
            if request.draft_length is not None:
                return EntropySwitch(self.config.entropy, k=request.draft_length)
            if self.policy.serves_fast_mode:
                return self.policy
            if self._fast_policy is None:
                self._fast_policy = make_policy("entropy", self.config)
            return self._fast_policy
        if request.draft_length is None:
            return self.policy
        return FixedK(request.draft_length, draft_ahead=self.config.draft_ahead,
                      send_ahead=self.config.send_ahead)
