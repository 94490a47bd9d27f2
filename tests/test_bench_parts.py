"""The bench's parts without a verifier: rows from synthetic generations (through
tandem/metrics.py), the goal ratios, the oracle's draft lengths, the throttled draft runtime and
the energy accounting."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from bench.bench.config import ALL_CONFIGURATIONS, BenchConfig, DeviceSpec, fixed_k, load_device
from bench.bench.device import ThrottledDraft, joules
from bench.bench.oracle import CloudOnly, OraclePolicy, match_runs
from bench.bench.results import (ROW_FIELDS, Generation, Row, agreement, format_goals, format_table,
                                 goals, rows_of, summarize)
from edge.config import DeviceProfile
from edge.control.policy import RoundView
from edge.runtime.base import DraftRuntime
from tandem.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


class ScriptedDraft(DraftRuntime):
    """A draft whose next-token guess after token t is guess[t] (a fixed table)."""
    name = "scripted"
    n_ctx = 4096

    def __init__(self, guess: dict[int, int], vocab: int = 16) -> None:
        super().__init__()
        self.guess, self.vocab_size, self.tokens = guess, vocab, []

    @property
    def position(self) -> int:
        return len(self.tokens)

    def extend(self, token_ids):
        self._check_extend(token_ids)
        self.tokens += list(token_ids)
        logits = torch.zeros(len(token_ids), self.vocab_size)
        for i, t in enumerate(token_ids):
            logits[i, self.guess.get(t, 0)] = 5.0
        return logits

    def rollback(self, position: int) -> None:
        self._check_rollback(position)
        del self.tokens[position:]

    def fingerprint(self) -> str:
        return "scripted"


def view(generated: int, max_k: int = 16, remaining: int = 100) -> RoundView:
    return RoundView(round=0, generated=generated, remaining=remaining, max_k=max_k,
                     link_state="up", sampling=False, history=())


def gen(config="fixed-k4", channel="lte", device="phone", tokens=10, wall_s=1.0, ttft_s=0.1,
        **kw) -> Generation:
    return Generation(channel=channel, device=device, config=config, prompt=0, tokens=tokens,
                      wall_s=wall_s, ttft_s=ttft_s, **kw)


def test_configuration_names_are_the_issues():
    assert ALL_CONFIGURATIONS == (
        "cloud-only", "edge-only", "fixed-k1", "fixed-k2", "fixed-k4", "fixed-k8", "fixed-k16",
        "hf-heuristic", "llamacpp-pmin", "sglang-ema", "adaptive", "adaptive-pipelined",
        "adaptive-capped", "oracle")
    assert fixed_k("fixed-k16") == 16 and fixed_k("adaptive") is None
    with pytest.raises(ValueError):
        BenchConfig(configurations=("fixed-k4", "magic"))
    BenchConfig(configurations=("fixed-k3",))  # any fixed k


def test_shipped_bench_config_validates_and_runs_every_configuration():
    config = load_config(ROOT / "configs/bench.yaml", BenchConfig)
    assert config.configurations == ALL_CONFIGURATIONS
    assert config.client_overrides["adaptive-pipelined"] == BenchConfig().client_overrides["adaptive-pipelined"]


def test_shipped_device_profiles_load():
    config = BenchConfig()
    laptop, phone = load_device(config, "laptop"), load_device(config, "phone")
    assert laptop.draft_tokens_per_s == 0 and 30 <= phone.draft_tokens_per_s <= 60
    assert phone.profile.joules_per_draft_token > 0
    with pytest.raises(ConfigError):
        load_device(config, "toaster")


def test_rows_use_the_metric_formulas():
    gs = [gen(tokens=10, wall_s=1.0, ttft_s=0.1, accepted=6, rounds=4, target_passes=4,
              bytes_up=100, bytes_down=50, joules=0.5, agreement=1.0),
          gen(tokens=20, wall_s=4.0, ttft_s=0.3, accepted=10, rounds=6, target_passes=6,
              bytes_up=200, bytes_down=100, joules=1.0, agreement=0.5)]
    row = summarize(gs)
    assert tuple(vars(row)) == ROW_FIELDS
    assert row.tokens_per_s == pytest.approx((10 / 1.0 + 20 / 4.0) / 2)   # mean per request
    assert row.ttft_s == pytest.approx(0.2)
    assert row.tpot_s == pytest.approx(((1.0 - 0.1) / 9 + (4.0 - 0.3) / 19) / 2)
    assert row.tau == pytest.approx(1 + 16 / 10)
    assert row.passes_per_token == pytest.approx(10 / 30)
    assert row.bytes_per_token == pytest.approx(450 / 30)
    assert row.joules_per_token == pytest.approx(1.5 / 30)
    assert row.agreement == pytest.approx(0.75)
    # edge-only: no verification round at all -> tau's defined empty case
    assert summarize([gen(config="edge-only")]).tau == 1.0
    assert [r.config for r in rows_of([gen("a"), gen("b"), gen("a")])] == ["a", "b"]


def test_agreement_is_positional_and_counts_missing_tokens():
    assert agreement([1, 2, 3], [1, 2, 3]) == 1.0
    assert agreement([1, 9, 3], [1, 2, 3]) == pytest.approx(2 / 3)
    assert agreement([1], [1, 2]) == 0.5
    assert agreement([], []) == 1.0


def _rows(speeds: dict[tuple[str, str, str], float], passes: dict | None = None) -> list[Row]:
    passes = passes or {}
    return [Row(c, d, n, v, 0.1, 0.01, 2.0, passes.get((c, d, n), 0.2), 10.0, 0.01, 1.0)
            for (c, d, n), v in speeds.items()]


def test_goals_ratios_on_synthetic_rows():
    speeds = {}
    for channel in ("lan", "lte"):
        for device in ("laptop", "phone"):
            base = 100.0 if channel == "lan" else 40.0
            speeds.update({(channel, device, "fixed-k4"): base, (channel, device, "fixed-k8"): base * 0.9,
                           (channel, device, "hf-heuristic"): base * 0.8,
                           (channel, device, "sglang-ema"): base * 0.95,
                           (channel, device, "adaptive"): base, (channel, device, "adaptive-pipelined"): base * 1.2,
                           (channel, device, "oracle"): base * 1.4, (channel, device, "cloud-only"): base})
    passes = {(c, d, "cloud-only"): 1.0 for c in ("lan", "lte") for d in ("laptop", "phone")}
    result = {g.goal: g for g in goals(_rows(speeds, passes), {"lan": 1.0, "lte": 60.0})}
    peer = next(g for name, g in result.items() if "peer" in name)
    assert peer.measured == pytest.approx(1.2 / 0.95) and peer.met
    assert "lan" not in peer.detail                              # RTT 1 ms < 20 ms
    best_fixed = next(g for name, g in result.items() if "best fixed k of each" in name)
    assert best_fixed.measured == pytest.approx(1.2) and best_fixed.met
    average = next(g for name, g in result.items() if "best on average" in name)
    assert average.measured == pytest.approx(1.2) and average.met and "fixed-k4" in average.detail
    pipelining = next(g for name, g in result.items() if name.startswith("pipelining"))
    assert pipelining.measured == pytest.approx(1.2) and not pipelining.met
    assert pipelining.detail == "lte/phone 1.20"
    oracle = next(g for name, g in result.items() if "oracle" in name)
    assert oracle.measured == pytest.approx(1.2 / 1.4) and oracle.met
    passes_goal = next(g for name, g in result.items() if "passes per token" in name)
    assert passes_goal.measured == pytest.approx(0.2) and passes_goal.met
    cloud_speed = next(g for name, g in result.items() if "cloud-only tokens/s" in name)
    assert cloud_speed.measured == pytest.approx(1.2) and cloud_speed.met
    cloud_passes = next(g for name, g in result.items() if "cloud-only's" in name)
    assert cloud_passes.measured == pytest.approx(0.2) and cloud_passes.met
    text = format_goals(list(result.values()))
    assert "NOT met" in text and "met" in text
    assert "adaptive-pipelined" in format_table(_rows(speeds), markdown=True)


def test_goals_without_the_configurations_they_need_say_so():
    speeds = {("lte", "phone", "fixed-k4"): 10.0, ("lte", "phone", "adaptive"): 12.0}
    result = goals(_rows(speeds), {"lte": 60.0})
    assert all(g.met is None for g in result if "peer" in g.goal or "oracle" in g.goal
               or "pipelining" in g.goal or "cloud-only" in g.goal)
    assert next(g for g in result if "best fixed k of each" in g.goal).measured == pytest.approx(1.2)


def test_match_runs_are_the_draft_runs_along_the_reference():
    # the draft guesses t+1 after t, except after 5 (guesses 0)
    draft = ScriptedDraft({t: t + 1 for t in range(15) if t != 5})
    prompt, reference = [1, 2], [3, 4, 5, 6, 7, 9, 10]
    #           guesses:      3  4  5  6x 7  8x 10  (6x: after 5 it guesses 0; 8x: 9 expected)
    assert match_runs(draft, prompt, reference) == [3, 2, 1, 0, 1, 0, 1]
    assert draft.position == 0


def test_oracle_drafts_the_known_run_within_the_caps():
    oracle = OraclePolicy()
    oracle.runs = [3, 2, 1, 0, 1]
    assert oracle.plan(view(0)).k == 3
    assert oracle.plan(view(3)).k == 0
    assert oracle.plan(view(0, max_k=2)).k == 2
    assert oracle.plan(view(9)).k == 0        # past the known text: plain decoding
    plan = CloudOnly().plan(view(4, remaining=12))
    assert (plan.k, plan.cloud_generate) == (0, 12)


def test_throttled_draft_waits_to_the_device_rate_and_passes_everything_through():
    inner = ScriptedDraft({1: 2, 2: 3})
    draft = ThrottledDraft(inner, draft_tokens_per_s=200.0, prefill_tokens_per_s=1000.0)
    assert (draft.vocab_size, draft.n_ctx, draft.fingerprint()) == (16, 4096, "scripted")
    started = time.monotonic()
    draft.extend([1, 2, 3, 4, 5])   # prefill: >= 5 ms
    for t in (1, 2, 3, 4):          # 4 decode steps: >= 20 ms
        assert int(draft.extend([t])[-1].argmax()) == inner.guess.get(t, 0)
    assert time.monotonic() - started >= 0.025
    assert draft.position == 9 and draft.speed.decode_tokens == 4
    assert draft.speed.decode_s >= 0.02 and draft.speed.prefill_s >= 0.005
    draft.rollback(2)
    assert inner.position == 2


def test_energy_counts_draft_tokens_and_bytes():
    profile = DeviceProfile(joules_per_draft_token=0.1, joules_per_byte_up=1e-3,
                            joules_per_byte_down=1e-4)
    assert joules(profile, 10, 100, 1000) == pytest.approx(1.0 + 0.1 + 0.1)
    assert DeviceSpec(name="x").profile == DeviceProfile()
