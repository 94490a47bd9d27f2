"""Typed configuration of `tandem sim` (configs/sim.yaml).

The simulation reuses the edge and cloud configs the repository ships and overrides only what a
loopback run needs; the overrides are plain nested mappings that are validated by EdgeConfig and
CloudConfig themselves, so every knob keeps one definition.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from tandem.config import Settings, resolve_path

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
    # (when it is not run, sim/runner.py plots the first profile run and logs a warning)

    @field_validator("profiles")
    @classmethod
    def _known_profiles(cls, profiles: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if len(set(profiles)) != len(profiles):
            raise ValueError("profiles must not repeat")
        _check_names(profiles, info)
        return profiles

    @field_validator("profile_overrides")
    @classmethod
    def _known_overrides(cls, overrides: dict, info: ValidationInfo) -> dict:
        # Overrides of profiles not run this time are kept (a run of a subset, e.g.
        # --profiles lan,lte, uses the same sim.yaml); a name without a profile file is an error.
        _check_names(tuple(overrides), info)
        return overrides


def _check_names(names: tuple[str, ...], info: ValidationInfo) -> None:
    """Every name is a PROFILE.yaml in channels_dir; else the nearest one is suggested."""
    directory = info.data.get("channels_dir")
    if directory is None:
        return
    available = sorted(p.stem for p in resolve_path(directory).glob("*.yaml"))
    for name in names:
        if name not in available:
            hint = difflib.get_close_matches(name, available, n=1)
            raise ValueError(f"unknown channel profile {name!r}"
                             + (f" (did you mean {hint[0]!r}?)" if hint else "")
                             + f"; profiles in {directory}: {', '.join(available)}")
