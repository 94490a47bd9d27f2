"""What a `tandem capacity` run is asked to do: its configurations and every knob with its
default. Imports nothing heavy, so `tandem --help` stays fast (tests/tandem/test_config_sources.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIGS = ("cloud-only", "adaptive", "adaptive-capped", "fixed-k4", "vllm-alone", "adaptive-unpriced")
VLLM = "vllm-alone"
# The verifier settings a configuration needs beyond the shipped ones. adaptive-unpriced is the
# shipped controller on a verifier that never prices its passes (price 0 at any load): the
# default as it was before the price, kept to measure what the price buys.
CLOUD_SETS = {"adaptive-unpriced": ("batch.target_queue_ms=60000",)}
# Each configuration's edge policy (bench.matrix.cell.client_config reads "adaptive*" names).
POLICY_OF = {"adaptive-unpriced": "adaptive"}


@dataclass
class CapacityOptions:
    """Every knob of a capacity run, with its default (the CLI's flags override these)."""
    bench_config: Path = Path("configs/bench.yaml")   # edge config, devices, client overrides
    cloud_config: Path = Path("configs/cloud.yaml")   # the shipped verifier, as an operator runs it
    configs: tuple[str, ...] = CONFIGS[:5]
    users: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    refine: bool = True            # one midpoint between the last pass and the first miss
    every_count: bool = False      # measure every user count, past misses too (comparisons)
    interleave: bool = True        # each count for every configuration before the next count:
                                   # configurations swept one after another met different
                                   # moments of a shared machine (+-15% a point), and their
                                   # ratios are what a run is read for
    slo_ttft_s: float = 1.0
    slo_tpot_s: float = 0.1
    extra_tpot_slos: tuple[float, ...] = (0.05,)
    warmup_s: float = 5.0
    window_s: float = 20.0
    drain_s: float = 30.0
    think_s: float = 0.0
    prompts: int = 16
    prompt_offset: int = 16        # past the decided bench's 16 prompts
    max_tokens: int = 48
    server_cores: tuple[int, ...] = (0,)   # the servers' cores (verifier i on cores[i % len])
    verifiers: int = 1             # server processes per configuration (users spread over them)
    live_draft: bool = False       # each user runs the real draft (small N: the replay check)
    replay_depth: int = 24         # the draft chain precomputed at every position
    cloud_sets: tuple[str, ...] = ()   # --set KEY=VALUE for the verifier
