"""One cell of `tandem bench` (a device and a channel profile), measured unit by unit.

  verifier (cloud.server, in this process, 127.0.0.1:free port, the target loaded once)
     ^ gRPC
  link emulator (sim.netem.ChannelProxy), rewound to the unit's offset before each
  configuration
     ^ gRPC
  one EdgeClient per configuration (its policy lives across the prompts, as in a real edge),
  all on one draft runtime per device (ThrottledDraft for a slower device)

CellBench holds what every cell of one process shares (prompts, the target's greedy references,
the draft, the verifier); bench/matrix/runner.py runs the cells one after the other with one, and
bench/matrix/workers.py one per worker process.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from bench.matrix.config import BenchConfig, DeviceSpec, fixed_k
from bench.matrix.device import ThrottledDraft, joules
from bench.matrix.oracle import CloudOnly, OraclePolicy, match_runs, target_greedy
from bench.matrix.results import GenerationSummary, agreement
from sim.netem import ChannelProfile, ChannelProxy
from tandem.prompts import load_prompts
from cloud.config import CloudConfig
from cloud.runtime.target import TargetRuntime
from cloud.server import create_server
from edge.client import EdgeClient
from edge.request import GenerationRequest
from edge.config import ClientConfig, EdgeConfig, resolve_paths
from edge.control.policy import DraftPolicy, FixedK, make_policy
from edge.drafting import DraftCursor, TokenChooser
from edge.link import make_channel
from edge.record import GenerationResult
from edge.runtime import load_draft_runtime
from edge.runtime.base import DraftRuntime
from edge.tokenizer import EdgeTokenizer
from tandem.config import ConfigError, load_config, merge, resolve_path
from tandem.sampling import SamplingParams
from tandem.v1 import decoding_pb2 as pb
from tandem.v1 import decoding_pb2_grpc as pb_grpc

TRACE_FIELDS = ("t_start_s", "k_asked", "drafted", "accepted", "rtt_s", "server_forward_s", "mode")


def edge_config_of(config: BenchConfig) -> EdgeConfig:
    return resolve_paths(load_config(resolve_path(config.edge_config), EdgeConfig, config.edge_overrides))


def cloud_config_of(config: BenchConfig) -> CloudConfig:
    overrides = merge(config.cloud_overrides, {"server": {"host": "127.0.0.1", "port": 0}})
    return load_config(resolve_path(config.cloud_config), CloudConfig, overrides)


def client_config(config: BenchConfig, base: ClientConfig, name: str, device: DeviceSpec) -> ClientConfig:
    """The edge client config of one configuration on one device."""
    tree = base.model_dump()
    k = fixed_k(name)
    if k is not None:
        tree = merge(tree, {"policy": "fixed", "draft_length": k})
    elif name not in ("cloud-only", "edge-only", "oracle"):
        tree = merge(tree, {"policy": "adaptive" if name.startswith("adaptive") else name})
    tree = merge(tree, config.client_overrides.get(name, {}))
    tree = merge(tree, {"device": device.profile.model_dump()})
    try:
        return ClientConfig.model_validate(tree)
    except ValueError as error:
        raise ConfigError(f"client config of {name}: {error}") from None


def build_policy(name: str, client: ClientConfig) -> DraftPolicy:
    if name == "cloud-only":
        return CloudOnly()
    if name == "oracle":
        return OraclePolicy()
    if name == "edge-only":
        return FixedK(0)  # unused: edge-only never talks to the verifier
    return make_policy(client.policy, client)


def run_edge_only(draft: DraftRuntime, prompt_ids: Sequence[int], max_tokens: int) -> tuple[list[int], float, float]:
    """The draft alone, greedy, token by token: (tokens, wall_s, ttft_s)."""
    cursor = DraftCursor(draft)
    chooser = TokenChooser(SamplingParams(), q_scale=1)
    context = list(prompt_ids)
    out: list[int] = []
    t0 = time.monotonic()
    ttft = 0.0
    while len(out) < max_tokens and len(context) < draft.n_ctx:
        block = cursor.draft(context, 1, chooser, vocab_size=draft.vocab_size, max_entries=1)
        out += block.tokens
        context += block.tokens
        if len(out) == 1:
            ttft = time.monotonic() - t0
    return out, time.monotonic() - t0, ttft


def from_result(result: GenerationResult, keep_rounds: bool) -> dict:
    log_ = result.rounds_log
    return dict(tokens=len(result.token_ids), wall_s=result.wall_s, ttft_s=result.ttft_s,
                accepted=sum(result.accepted_lengths), rounds=result.rounds,
                target_passes=result.target_passes, bytes_up=result.bytes_up,
                bytes_down=result.bytes_down, draft_tokens=sum(r.drafted for r in log_),
                unverified=result.verified.count(False), reopens=result.reopens,
                rounds_log=[{f: getattr(r, f) for f in TRACE_FIELDS} for r in log_] if keep_rounds else [])


@dataclass
class Cell:
    """One (device, channel) of the run and the trace offsets its units start at."""
    device: DeviceSpec
    profile: ChannelProfile
    offsets: list[float]


def cells_of(config: BenchConfig, channels: Sequence[ChannelProfile],
             devices: Sequence[DeviceSpec]) -> list[Cell]:
    return [Cell(device, profile, config.offsets_for(profile)) for device in devices for profile in channels]


class CellBench:
    """What every cell of one process shares, loaded once: the prompts, the target's greedy
    references, the draft, the verifier on 127.0.0.1 and, per device, the (throttled) draft
    warmed up on it. `run` measures one cell, unit by unit."""

    def __init__(self, config: BenchConfig, names: Sequence[str]) -> None:
        self.config, self.names = config, list(names)
        self.edge = edge_config_of(config)
        cloud = cloud_config_of(config)
        tokenizer = EdgeTokenizer(self.edge.draft.resolved_tokenizer_dir)
        texts = load_prompts(resolve_path(config.prompts_file), config.prompts + config.warmup_requests,
                             config.prompt_offset, config.max_prompt_chars)
        self.prompts = [tokenizer.encode(t) for t in texts[:config.prompts]]
        self.warmups = [tokenizer.encode(t) for t in texts[config.prompts:]]
        target = TargetRuntime(resolve_path(cloud.model.path), device=cloud.model.device, dtype=cloud.model.dtype)
        self.references = [target_greedy(target, p, config.max_tokens) for p in self.prompts]
        self.base_draft = load_draft_runtime(self.edge.draft)
        self.runs = [match_runs(self.base_draft, p, ref, target.vocab_size)
                     for p, ref in zip(self.prompts, self.references)]
        self.server, self.port = create_server(cloud, target)
        self.server.start()
        self.drafts: dict[str, DraftRuntime] = {}   # device name -> its draft, warmed up

    def draft_of(self, device: DeviceSpec) -> DraftRuntime:
        if device.name not in self.drafts:
            draft: DraftRuntime = self.base_draft
            if device.draft_tokens_per_s or device.prefill_tokens_per_s:
                draft = ThrottledDraft(self.base_draft, device.draft_tokens_per_s, device.prefill_tokens_per_s)
            _warm_up(self.edge, self.port, draft, self.warmups, self.config.max_tokens)
            self.drafts[device.name] = draft
        return self.drafts[device.name]

    def run(self, cell: Cell, emit: Callable[[GenerationSummary], None]) -> None:
        config, edge, device, profile = self.config, self.edge, cell.device, cell.profile
        draft = self.draft_of(device)
        with ChannelProxy(profile, upstream=("127.0.0.1", self.port)) as proxy:
            host, proxy_port = proxy.address
            channel = make_channel(edge.cloud, f"{host}:{proxy_port}")
            try:
                clients = {}
                for name in self.names:
                    cc = client_config(config, edge.client, name, device)
                    # cloud-only drafts nothing; its client still syncs the draft's cache
                    # once, which a device would not do at all: let that cost nothing.
                    own = self.base_draft if name == "cloud-only" else draft
                    clients[name] = EdgeClient(channel, own, cc, policy=build_policy(name, cc))
                for i, prompt in enumerate(self.prompts):
                    for offset in cell.offsets:
                        for name in self.names:
                            proxy.rewind(offset, seed=f"{profile.seed}:{config.seed}:{i}:{offset}")
                            if name != "edge-only":
                                _reconnect(channel, edge.cloud.max_reconnect_backoff_s + 2.0)
                            g = _one(config, name, clients[name], draft, device,
                                     profile.name, i, prompt, self.references[i], self.runs[i])
                            g.offset_s = offset
                            emit(g)
            finally:
                channel.close()

    def close(self) -> None:
        self.server.stop(0).wait(30)
        self.base_draft.close()


def _one(config: BenchConfig, name: str, client: EdgeClient, draft: DraftRuntime, device: DeviceSpec,
         channel: str, index: int, prompt: list[int], reference: list[int], runs: list[int]) -> GenerationSummary:
    draft.rollback(0)  # every cursor on this runtime re-syncs from scratch (no stale cache)
    if name == "edge-only":
        tokens, wall_s, ttft_s = run_edge_only(draft, prompt, config.max_tokens)
        stats = dict(tokens=len(tokens), wall_s=wall_s, ttft_s=ttft_s, draft_tokens=len(tokens))
    else:
        if isinstance(client.policy, OraclePolicy):
            client.policy.runs = runs
        res = client.generate(GenerationRequest(prompt, config.max_tokens))
        tokens = res.token_ids
        stats = from_result(res, keep_rounds=name.startswith("adaptive") and channel == config.lte_channel)
    g = GenerationSummary(channel=channel, device=device.name, config=name, prompt=index, **stats)
    g.joules = joules(device.profile, g.draft_tokens, g.bytes_up, g.bytes_down)
    g.agreement = agreement(tokens, reference)
    return g


def _reconnect(channel: grpc.Channel, timeout_s: float) -> bool:
    """Wait, untimed, until the channel is connected: a link an outage broke during the previous
    configuration's request must not make the next one start in reconnect backoff. False when
    it does not connect in time (the unit starts inside an outage window): the request then
    meets the outage, as it would. An Info call with wait_for_ready, not channel_ready_future:
    the latter's connectivity-polling thread raises once the channel is closed."""
    try:
        pb_grpc.DecodingStub(channel).Info(pb.InfoRequest(), timeout=timeout_s,
                                           wait_for_ready=True)
        return True
    except grpc.RpcError:
        return False


def _warm_up(edge: EdgeConfig, port: int, draft: DraftRuntime, prompts: Sequence[list[int]],
             max_tokens: int) -> None:
    """Untimed generations straight to the verifier: first passes are slow everywhere."""
    channel = make_channel(edge.cloud, f"127.0.0.1:{port}")
    try:
        client = EdgeClient(channel, draft, edge.client, policy=FixedK(4))
        for prompt in prompts:
            draft.rollback(0)
            client.generate(GenerationRequest(prompt, max_tokens))
    finally:
        channel.close()
