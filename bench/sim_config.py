"""Typed configuration of `tandem sim` (configs/sim.yaml).

The simulation reuses the edge and cloud configs the repository ships and overrides only what a
loopback run needs; the overrides are plain nested mappings that are validated by EdgeConfig and
CloudConfig themselves, so every knob keeps one definition.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from tandem.config import Settings

class SimConfig(Settings):
    edge_config: Path = Field(Path("configs/edge.yaml"), description="edge YAML (draft, client, daemon)")
    edge_overrides: dict[str, Any] = Field(default_factory=dict, description=(
        "nested overrides of the edge config, validated by EdgeConfig (e.g. client.offline_after_s)"))
    cloud_config: Path = Field(Path("configs/cloud.yaml"), description="verifier YAML")
    cloud_overrides: dict[str, Any] = Field(default_factory=dict, description=(
        "nested overrides of the cloud config, validated by CloudConfig; the simulation always "
        "binds the verifier to 127.0.0.1 on a free port"))
    channels_dir: Path = Field(Path("configs/channels"), description="where PROFILE.yaml files live")
    profiles: tuple[str, ...] = Field(("lan", "wifi", "lte", "3g", "flaky"), min_length=1,
                                      description="channel profiles, run one after another")
    profile_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "per profile, fields replaced in its ChannelProfile (e.g. an earlier outage so that a "
        "short run meets it)"))
    prompts_file: Path = Field(Path("models/prompts/heldout.jsonl"),
                               description="held-out code prompts, one JSON object with 'prompt' a line")
    prompts: int = Field(8, ge=1, le=1000, description="prompts per profile (the same ones for every profile)")
    prompt_offset: int = Field(0, ge=0, description="index of the first prompt used")
    max_prompt_chars: int = Field(1200, ge=1, le=100_000,
                                  description="longer prompts keep their last this many characters")
    max_tokens: int = Field(64, ge=1, le=4096, description="tokens generated per request")
    concurrency: int = Field(4, ge=1, le=256,
                             description="requests in flight at once (also the daemon's pool size)")
    warmup_requests: int = Field(2, ge=0, le=100, description=(
        "untimed requests straight to the verifier before the first profile (the target's "
        "first forward passes are slow)"))
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy")
    seed: int = Field(0, ge=0, description="sampling seed of request i is seed + i")
    request_timeout_s: float = Field(120.0, gt=0, le=3600, description="HTTP timeout per request")
    trace_profile: str = Field("lte", description=(
        "profile whose session is plotted over time (draft length and RTT per round)"))

    @model_validator(mode="after")
    def _known_profiles(self) -> SimConfig:
        unknown = set(self.profile_overrides) - set(self.profiles)
        if unknown:
            raise ValueError(f"profile_overrides for profiles not run: {sorted(unknown)}")
        if len(set(self.profiles)) != len(self.profiles):
            raise ValueError("profiles must not repeat")
        return self
