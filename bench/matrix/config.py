"""Typed configuration of `tandem bench` (configs/bench.yaml) and of its device profiles
(configs/devices/NAME.yaml).

Like `tandem sim`, the bench reuses the shipped edge and cloud configs and overrides only what a
loopback run needs; the overrides are nested mappings validated by EdgeConfig / CloudConfig.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from bench.matrix.channels import offsets_of
from sim.netem import ChannelProfile
from edge.config import DeviceProfile
from tandem.config import Settings, load_config, resolve_path

# The configurations a bench row can name (the names, so other tools can read the JSON).
BASELINES = ("cloud-only", "edge-only")
PEERS = ("hf-heuristic", "llamacpp-pmin", "sglang-ema")
FIXED_KS = (1, 2, 4, 8, 16)
ADAPTIVE_FAMILY = ("adaptive", "adaptive-pipelined", "adaptive-capped")  # one controller
UNVERIFIED = ("edge-only",)      # tokens the target never checked
ALL_CONFIGURATIONS = (*BASELINES, *(f"fixed-k{k}" for k in FIXED_KS), *PEERS,
                      *ADAPTIVE_FAMILY, "oracle")
DEFAULT_CLIENT_OVERRIDES = {
    "adaptive-pipelined": {"draft_ahead": True, "send_ahead": 4},
    # an operator's server-cost cap: at most 0.30 target passes per token
    "adaptive-capped": {"max_passes_per_token": 0.30},
}
_FIXED = re.compile(r"^fixed-k(\d+)$")


def fixed_k(name: str) -> int | None:
    """k of a `fixed-kN` configuration name, else None."""
    match = _FIXED.match(name)
    return int(match.group(1)) if match else None


class DeviceSpec(Settings):
    """An emulated edge device: how fast its draft may run, and its client device profile."""
    name: str = Field(..., min_length=1, description="short name, e.g. phone (--device NAME)")
    description: str = Field("", description="what real device this imitates")
    draft_tokens_per_s: float = Field(0.0, ge=0, le=1e6, description=(
        "cap on the draft's decode speed (tokens/s), emulated by waiting on a clock after each "
        "step; 0 = the draft's real speed"))
    prefill_tokens_per_s: float = Field(0.0, ge=0, le=1e7, description=(
        "cap on the draft's prefill speed (tokens/s, multi-token extends); 0 = real speed"))
    profile: DeviceProfile = Field(default_factory=DeviceProfile, description=(
        "the edge client's device section (energy costs, budget), as in configs/edge.yaml"))


class BenchConfig(Settings):
    edge_config: Path = Field(Path("configs/edge.yaml"), description="edge YAML (draft, client)")
    edge_overrides: dict[str, Any] = Field(default_factory=dict, description=(
        "nested overrides of the edge config for every configuration, validated by EdgeConfig"))
    cloud_config: Path = Field(Path("configs/cloud.yaml"), description="verifier YAML")
    cloud_overrides: dict[str, Any] = Field(default_factory=dict, description=(
        "nested overrides of the cloud config; the verifier always binds 127.0.0.1:free port"))
    channels: tuple[Path, ...] = Field(
        (Path("configs/channels/lan.yaml"), Path("configs/channels/lte.yaml"),
         Path("configs/channels/3g.yaml")), min_length=1,
        description="channel profile files (sim.netem.ChannelProfile), run one after another")
    devices_dir: Path = Field(Path("configs/devices"), description="where NAME.yaml device "
                                                                   "profiles live")
    devices: tuple[str, ...] = Field(("laptop", "phone"), min_length=1,
                                     description="device profiles (names in devices_dir, or files)")
    configurations: tuple[str, ...] = Field(ALL_CONFIGURATIONS, min_length=1,
                                            description="configurations run per channel and device")
    client_overrides: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {k: dict(v) for k, v in DEFAULT_CLIENT_OVERRIDES.items()},
        description=("per configuration, nested overrides of the edge client config "
                     "(edge.config.ClientConfig), e.g. the adaptive controller's pipelining for "
                     "adaptive-pipelined; validated when the run starts, and a configuration "
                     "whose overrides this build's ClientConfig rejects is skipped, with why"))
    prompts_file: Path = Field(Path("models/prompts/heldout.jsonl"),
                               description="held-out code prompts, one JSON object with 'prompt' a line")
    prompts: int = Field(16, ge=1, le=1000, description="prompts per configuration (the same ones)")
    offsets: int | tuple[float, ...] = Field(4, description=(
        "trace offsets per prompt on a channel that replays a trace: a count spread evenly over "
        "the trace's period, or a list of seconds into it; a channel without a trace has one (0). "
        "Each (prompt, offset) is one paired unit: every configuration starts the channel at "
        "the unit's offset, with the same jitter and loss draws"))
    channel_offsets: dict[str, int | tuple[float, ...]] = Field(default_factory=dict, description=(
        "per channel name, offsets replacing `offsets` (e.g. starts just before a flaky "
        "profile's outage windows, which move with the trace's timeline)"))
    held_out_traces: tuple[Path, ...] = Field((), description=(
        "mahimahi trace files (PATH, or PATH.up / PATH.down) the run adds as channels, each "
        "with held_out_base's delay, jitter and loss"))
    held_out_base: Path = Field(Path("configs/channels/lte.yaml"), description=(
        "the channel profile a held-out trace replaces the capacity of"))
    resamples: int = Field(2000, ge=100, le=1_000_000, description=(
        "bootstrap resamples of the prompts behind every interval"))
    confidence: float = Field(0.95, gt=0, lt=1, description="coverage of the bootstrap intervals")
    seed: int = Field(0, ge=0, description="seed of the bootstrap and of the units' link draws")
    prompt_offset: int = Field(0, ge=0, description="index of the first prompt used")
    max_prompt_chars: int = Field(800, ge=1, le=100_000,
                                  description="longer prompts keep their last this many characters")
    max_tokens: int = Field(48, ge=2, le=1024, description="tokens generated per request (eos ignored)")
    warmup_requests: int = Field(1, ge=0, le=100, description=(
        "untimed generations per device before its first channel (first passes are slow)"))
    lte_channel: str = Field("lte", description=(
        "the LTE channel's name: its adaptive session is plotted over time (k, accepted length, "
        "RTT) and the LTE goals are measured on it"))
    goal_rtt_ms: float = Field(20.0, ge=0, description="profiles with a base RTT at least this "
                                                       "long count for the adaptive-vs-peers goal")
    pipelining_goal_rtt_ms: float = Field(50.0, ge=0, description="profiles with a base RTT at "
                                          "least this long count for the pipelining goal")
    workers: int = Field(1, ge=1, le=16, description=(
        "processes measuring cells at once, each with its own verifier and draft (a cell's units "
        "and configurations stay in one process, interleaved). A cell on a slow link or device "
        "mostly waits (a phone cell on lte: ~25% of one core), so a few workers cut a full run's "
        "time; 1 measures each cell alone on the machine"))

    def offsets_for(self, profile: ChannelProfile) -> list[float]:
        """Where the profile's units start: its channel_offsets entry, else `offsets`."""
        return offsets_of(profile, self.channel_offsets.get(profile.name, self.offsets))

    @model_validator(mode="after")
    def _known_configurations(self) -> "BenchConfig":
        unknown = [c for c in self.configurations if c not in ALL_CONFIGURATIONS and fixed_k(c) is None]
        if unknown:
            raise ValueError(f"unknown configurations {unknown}; known: {', '.join(ALL_CONFIGURATIONS)}"
                             " (or fixed-kN)")
        for offsets in (self.offsets, *self.channel_offsets.values()):
            if isinstance(offsets, int) and offsets < 1:
                raise ValueError("offsets: a count >= 1 or a list of seconds")
            if not isinstance(offsets, int) and (not offsets or min(offsets) < 0):
                raise ValueError("offsets: a non-empty list of seconds >= 0")
        if len(set(self.configurations)) != len(self.configurations):
            raise ValueError("configurations must not repeat")
        stray = set(self.client_overrides) - set(ALL_CONFIGURATIONS)
        stray = {s for s in stray if fixed_k(s) is None}
        if stray:
            raise ValueError(f"client_overrides for unknown configurations: {sorted(stray)}")
        return self


def load_device(config: BenchConfig, name_or_path: str) -> DeviceSpec:
    """A device profile by name (devices_dir/NAME.yaml) or by path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = resolve_path(config.devices_dir) / f"{name_or_path}.yaml"
    return load_config(resolve_path(path), DeviceSpec)
