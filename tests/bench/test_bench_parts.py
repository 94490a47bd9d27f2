"""The bench's parts without a verifier: rows from synthetic generations (through
tandem/metrics.py), the goal ratios, the oracle's draft lengths, the throttled draft runtime and
the energy accounting."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.matrix.channels import held_out_profile, offsets_of, trace_pair
from bench.matrix.config import ALL_CONFIGURATIONS, BenchConfig, DeviceSpec, fixed_k, load_device
from bench.matrix.device import ThrottledDraft, joules
from bench.matrix.oracle import CloudOnly, OraclePolicy, match_runs
from bench.matrix.goals import CELLS, DECISION_GOALS, EARLIER_GOALS, VERSUS, goals, overall
from bench.matrix.units import Units
from bench.matrix.report import format_goals, format_table
from bench.matrix.results import ROW_FIELDS, GenerationSummary, agreement, rows_of, bench_row
from bench.matrix.stats import Interval, bootstrap, bootstrap_ratio, verdict, versus_one
from sim.netem import load_profile
from edge.config import DeviceProfile
from edge.control.policy import RoundView
from edge.runtime.base import DraftRuntime
from tandem.config import ConfigError, load_config

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]


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
        **kw) -> GenerationSummary:
    return GenerationSummary(channel=channel, device=device, config=config, prompt=0, tokens=tokens,
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
    assert config.client_overrides == BenchConfig().client_overrides
    assert config.client_overrides["adaptive-capped"] == {"max_passes_per_token": 0.30}
    assert config.prompts >= 16 and config.offsets == BenchConfig().offsets


def test_a_client_key_this_build_lacks_skips_its_configuration_with_why():
    """adaptive-capped's cap is validated by ClientConfig when the run starts: a build whose
    ClientConfig has no such key skips the configuration (and says why) instead of running it
    uncapped or refusing the whole run."""
    from bench.matrix.runner import available_configurations
    from edge.config import ClientConfig

    config = BenchConfig(configurations=("fixed-k4", "adaptive", "adaptive-capped"),
                         client_overrides={"adaptive-capped": {"no_such_key": 1}})
    ok, skipped = available_configurations(config, ClientConfig(), [DeviceSpec(name="x")])
    assert ok == ["fixed-k4", "adaptive"] and "no_such_key" in skipped["adaptive-capped"]
    shipped = BenchConfig(configurations=("adaptive-capped",))
    ok, skipped = available_configurations(shipped, ClientConfig(), [DeviceSpec(name="x")])
    if "max_passes_per_token" in ClientConfig.model_fields:
        assert ok == ["adaptive-capped"]
    else:
        assert "max_passes_per_token" in skipped["adaptive-capped"]


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
    row = bench_row(gs)
    assert tuple(vars(row)) == ROW_FIELDS and (row.prompts, row.units) == (1, 1)
    assert row.tokens_per_s == pytest.approx((10 / 1.0 + 20 / 4.0) / 2)   # mean per request
    assert row.ttft_s == pytest.approx(0.2)
    assert row.tpot_s == pytest.approx(((1.0 - 0.1) / 9 + (4.0 - 0.3) / 19) / 2)
    assert row.tau == pytest.approx(1 + 16 / 10)
    assert row.passes_per_token == pytest.approx(10 / 30)
    assert row.bytes_per_token == pytest.approx(450 / 30)
    assert row.joules_per_token == pytest.approx(1.5 / 30)
    assert row.agreement == pytest.approx(0.75)
    # edge-only: no verification round at all -> tau's defined empty case
    assert bench_row([gen(config="edge-only")]).tau == 1.0
    assert [r.config for r in rows_of([gen("a"), gen("b"), gen("a")])] == ["a", "b"]


def test_agreement_is_positional_and_counts_missing_tokens():
    assert agreement([1, 2, 3], [1, 2, 3]) == 1.0
    assert agreement([1, 9, 3], [1, 2, 3]) == pytest.approx(2 / 3)
    assert agreement([1], [1, 2]) == 0.5
    assert agreement([], []) == 1.0


def _generations(speeds: dict[tuple[str, str, str], float], prompts: int = 8, offsets=(0.0,),
                 passes: dict | None = None, spread: float = 0.02) -> list[GenerationSummary]:
    """Every configuration on every (prompt, offset) unit: 10 tokens at the given mean speed,
    times a per-prompt factor shared by all configurations (prompts differ, pairing holds) and
    a small per-configuration wobble."""
    passes = passes or {}
    out = []
    for p in range(prompts):
        for o in offsets:
            for (c, d, n), v in speeds.items():
                factor = (1 + 0.5 * ((p % 4) - 1.5)) * (1 + spread * (((p * 7 + len(n)) % 5) - 2))
                out.append(GenerationSummary(channel=c, device=d, config=n, prompt=p, tokens=10,
                                      wall_s=10 / (v * factor), ttft_s=0.05, offset_s=o,
                                      target_passes=round(10 * passes.get((c, d, n), 0.2))))
    return out


def test_bootstrap_ratio_of_paired_means_contains_the_truth():
    rng = np.random.default_rng(1)
    base = rng.uniform(5, 50, size=32)                  # prompts differ a lot ...
    a, b = 1.2 * base * rng.normal(1, 0.05, 32), base   # ... A is 1.2x B on every one of them
    r = bootstrap_ratio(a, b, seed=3)
    assert r.low < r.value < r.high and r.low < 1.2 < r.high and r.low > 1.1
    assert (r.high - r.low) < 0.1                        # pairing cancels the prompt spread
    assert bootstrap_ratio(a, b, seed=3) == r           # seeded
    assert versus_one(r) == "faster" and verdict(r, 1.1) == "met" and verdict(r, 1.3) == "not met"
    assert verdict(r, 1.2) == "tie"                      # the interval contains the threshold
    same = bootstrap_ratio(base * rng.normal(1, 0.1, 32), base)
    assert versus_one(same) == "tie" and verdict(same, 1.0) == "tie"


def test_bootstrap_percentile_interval_by_hand():
    # two prompts, A/B = 1 on one and 3 on the other: resamples give 1, 2 (either order) or 3
    r = bootstrap_ratio([1.0, 3.0], [1.0, 1.0], resamples=4000)
    assert r.value == pytest.approx(2.0) and (r.low, r.high) == (1.0, 3.0)
    low, high = bootstrap(lambda idx: idx.sum(axis=1).astype(float), 2, resamples=4000,
                          confidence=0.4)
    assert (low, high) == (1.0, 1.0)                    # half the resamples sum to 1


def test_bootstrap_degenerate_cases():
    one = bootstrap_ratio([3.0], [2.0])
    assert one == Interval(1.5, None, None) and verdict(one, 1.0) == "tie" and versus_one(one) == "tie"
    assert bootstrap_ratio([1.0, 2.0], [0.0, 0.0]) == Interval(None)   # B never moved: undefined
    assert verdict(Interval(None), 1.0) == "n/a" and versus_one(Interval(None)) == "n/a"
    zero = bootstrap_ratio([0.0, 0.0, 0.0], [1.0, 2.0, 3.0])           # A never moved
    assert zero == Interval(0.0, 0.0, 0.0) and verdict(zero, 0.95) == "not met"
    # B stalled on one prompt only: a resample of that prompt alone is infinite, kept as such
    partial = bootstrap_ratio([1.0, 1.0, 1.0], [0.0, 1.0, 1.0], resamples=500)
    assert partial.value == pytest.approx(1.5) and partial.high == np.inf
    assert verdict(Interval(0.2, 0.1, 0.3), 0.30, at_most=True) == "met"
    assert verdict(Interval(0.35, 0.31, 0.4), 0.30, at_most=True) == "not met"
    assert verdict(Interval(0.29, 0.2, 0.4), 0.30, at_most=True) == "tie"
    with pytest.raises(ValueError):
        bootstrap_ratio([1.0, 2.0], [1.0])


def test_rows_carry_an_interval_over_prompts_and_count_units():
    gs = _generations({("lte", "phone", "fixed-k4"): 20.0}, prompts=6, offsets=(0.0, 30.0))
    (row,) = rows_of(gs)
    assert (row.prompts, row.units) == (6, 12)
    assert row.tokens_per_s_low < row.tokens_per_s < row.tokens_per_s_high
    assert rows_of(gs[:1])[0].tokens_per_s_low is None


def test_overall_verdict_over_cells():
    assert overall(["met", "met"]) == "met"
    assert overall(["met", "tie"]) == "tie"
    assert overall(["met", "tie", "not met"]) == "not met"
    assert overall(["n/a", "met"]) == "met" and overall(["n/a"]) == "n/a" and overall([]) == "n/a"


def _speeds(scale: dict[str, float]) -> dict[tuple[str, str, str], float]:
    out = {}
    for channel in ("lan", "lte"):
        for device in ("laptop", "phone"):
            base = 100.0 if channel == "lan" else 40.0
            out.update({(channel, device, n): base * f for n, f in scale.items()})
    return out


SCALE = {"fixed-k4": 1.0, "fixed-k8": 0.9, "hf-heuristic": 0.8, "sglang-ema": 0.95,
         "adaptive": 1.0, "adaptive-pipelined": 1.2, "adaptive-capped": 0.98, "oracle": 1.4,
         "cloud-only": 1.0, "edge-only": 5.0}


def test_decision_goals_on_synthetic_generations():
    passes = {(c, d, n): (1.0 if n == "cloud-only" else 0.2) for c in ("lan", "lte")
              for d in ("laptop", "phone") for n in SCALE}
    gs = _generations(_speeds(SCALE), prompts=12, offsets=(0.0, 40.0), passes=passes)
    result = goals(gs, {"lan": 1.0, "lte": 60.0})
    by = {g.goal: g for g in result}
    other = by["adaptive >= 0.95x the best other verified configuration (cloud-only included)"]
    # edge-only (unverified), the oracle and adaptive's own variants are not "other"
    assert {c.b for c in other.cells} <= {"fixed-k4", "cloud-only"} and len(other.cells) == 4
    assert all(c.versus_one == "tie" for c in other.cells)       # adaptive = fixed-k4 = cloud-only
    assert other.measured == pytest.approx(1.0, abs=0.03) and other.low < 1.0 < other.high
    peer = next(g for g in result if g.goal.startswith("adaptive >= 1.1x the best peer"))
    assert [c.cell for c in peer.cells] == ["lte/laptop", "lte/phone"]   # RTT 1 ms < 20 ms
    assert all(c.b == "sglang-ema" for c in peer.cells)
    assert peer.measured == pytest.approx(1 / 0.95, rel=0.03) and peer.verdict == "not met"
    assert peer.met is False
    capped = by["adaptive-capped >= 0.95x the best fixed k"]
    assert all(c.b == "fixed-k4" for c in capped.cells) and capped.measured == pytest.approx(0.98, rel=0.03)
    cap = by["adaptive-capped target passes per token <= 0.30"]
    assert cap.verdict == "met" and cap.met and cap.measured == pytest.approx(0.2)
    # the older goals, now with intervals too
    best_fixed = next(g for g in result if "best fixed k of each" in g.goal)
    assert best_fixed.goal.startswith("adaptive-pipelined") and best_fixed.verdict == "met"
    assert best_fixed.measured == pytest.approx(1.2, rel=0.03)
    average = next(g for g in result if "best on average" in g.goal)
    assert average.measured == pytest.approx(1.2, rel=0.03) and "fixed-k4" in average.detail
    assert average.low < 1.2 < average.high
    pipelining = next(g for g in result if g.goal.startswith("pipelining"))
    assert pipelining.verdict == "not met" and [c.cell for c in pipelining.cells] == ["lte/phone"]
    oracle = next(g for g in result if "oracle" in g.goal)
    assert oracle.measured == pytest.approx(1.2 / 1.4, rel=0.03) and oracle.verdict == "met"
    cloud_passes = next(g for g in result if "cloud-only's" in g.goal)
    assert cloud_passes.measured == pytest.approx(0.2) and cloud_passes.verdict == "met"
    text = format_goals(result)
    assert "[not met]" in text and "[    met]" in text and "[" in text.split(":")[1]
    assert "adaptive-capped" in format_table(rows_of(gs), markdown=True)


def test_a_close_race_is_a_tie_not_a_verdict():
    speeds = _speeds({"fixed-k4": 1.0, "adaptive": 0.95, "adaptive-capped": 0.95})
    gs = _generations(speeds, prompts=6, spread=0.3)
    result = goals(gs, {"lan": 1.0, "lte": 60.0})
    capped = next(g for g in result if g.goal.startswith("adaptive-capped >= 0.95x"))
    assert capped.verdict == "tie" and capped.met is None
    assert all(c.low < 0.95 < c.high for c in capped.cells)


def test_capped_is_compared_with_the_fixed_k_that_keep_the_cap_too():
    # on a phone the fastest fixed k spends more target passes than the cap allows
    speeds = {("lan", "phone", "fixed-k1"): 70.0, ("lan", "phone", "fixed-k8"): 20.0,
              ("lan", "phone", "adaptive-capped"): 22.0}
    passes = {("lan", "phone", "fixed-k1"): 0.6, ("lan", "phone", "fixed-k8"): 0.3,
              ("lan", "phone", "adaptive-capped"): 0.3}
    by = {g.goal: g for g in goals(_generations(speeds, prompts=8, passes=passes), {"lan": 1.0})}
    any_cost = by["adaptive-capped >= 0.95x the best fixed k"]
    within = by["adaptive-capped >= 0.95x the best fixed k within 0.30 passes/token"]
    assert [c.b for c in any_cost.cells] == ["fixed-k1"] and any_cost.verdict == "not met"
    assert [c.b for c in within.cells] == ["fixed-k8"] and within.verdict == "met"
    assert within.measured == pytest.approx(22 / 20, rel=0.03)


def test_goals_without_the_configurations_they_need_say_so():
    speeds = {("lte", "phone", "fixed-k4"): 10.0, ("lte", "phone", "adaptive"): 12.0}
    result = goals(_generations(speeds), {"lte": 60.0})
    assert all(g.verdict == "n/a" and g.met is None for g in result
               if "peer" in g.goal or "oracle" in g.goal or "pipelining" in g.goal
               or "on lte" in g.goal and "cloud-only" in g.goal or "capped" in g.goal)
    other = next(g for g in result if "best other verified" in g.goal)
    assert [c.b for c in other.cells] == ["fixed-k4"]
    assert next(g for g in result if "best fixed k of each" in g.goal).measured == pytest.approx(1.2, rel=0.03)


def test_every_goal_row_names_a_known_metric_cell_choice_and_comparison():
    known = set(ALL_CONFIGURATIONS)
    for row in (*DECISION_GOALS, *EARLIER_GOALS):
        assert row.metric in ("speed", "passes", "passes ratio", "mean speed"), row.name
        assert row.cells in CELLS, row.name
        assert row.versus in VERSUS or row.versus in known or (row.metric == "passes"
                                                               and row.versus == ""), row.name
        assert row.a in known or row.a == "{adaptive}", row.name
    # one line per row, plus none: every row comes out once, in the table's order
    speeds = {("lte", "phone", c): 10.0 for c in ("adaptive", "adaptive-pipelined", "fixed-k4")}
    names = [g.goal for g in goals(_generations(speeds), {"lte": 60.0})]
    assert len(names) == len(DECISION_GOALS) + len(EARLIER_GOALS)
    assert names[len(DECISION_GOALS)].startswith("adaptive-pipelined >= 0.95x the best fixed k")


def test_pairing_uses_only_units_both_configurations_ran():
    gs = _generations({("lte", "phone", "fixed-k4"): 10.0, ("lte", "phone", "adaptive"): 10.0},
                      prompts=4, spread=0.0)
    # an extra, very fast adaptive unit that fixed-k4 never ran must not enter the ratio
    gs.append(GenerationSummary(channel="lte", device="phone", config="adaptive", prompt=0, tokens=10,
                         wall_s=0.01, ttft_s=0.001, offset_s=99.0))
    units = Units(gs)
    assert units.speed_ratio(("lte", "phone"), "adaptive", "fixed-k4").value == pytest.approx(1.0)


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


def test_offsets_spread_over_the_trace_or_as_given_and_one_without_a_trace():
    lte = load_profile(ROOT / "configs/channels/lte.yaml")   # ATT traces, period 120.002 s
    assert offsets_of(lte, 4) == [0.0, 30.0, 60.001, 90.001]
    assert offsets_of(lte, (5, 12.5)) == [5.0, 12.5]
    assert offsets_of(load_profile(ROOT / "configs/channels/lan.yaml"), 4) == [0.0]
    with pytest.raises(ValueError):
        BenchConfig(offsets=0)
    with pytest.raises(ValueError):
        BenchConfig(offsets=(-1.0,))


def test_held_out_trace_becomes_a_channel_with_the_base_profiles_delay(tmp_path):
    up, down = tmp_path / "city.up", tmp_path / "city.down"
    up.write_text("0\n5\n10\n")
    down.write_text("0\n1\n2\n2\n10\n")
    base = ROOT / "configs/channels/lte.yaml"
    assert trace_pair(tmp_path / "city") == (up, down)
    assert trace_pair(up) == (up, down) and trace_pair(down) == (up, down)
    alone = tmp_path / "single.trace"
    alone.write_text("0\n7\n")
    assert trace_pair(alone) == (alone, alone)
    profile = held_out_profile(tmp_path / "city", base)
    lte = load_profile(base)
    assert profile.name == "heldout-city" and profile.delay_ms == lte.delay_ms
    assert profile.uplink.trace == str(up.resolve()) and profile.downlink.load_trace().per_period == 5
    assert offsets_of(profile, 2) == [0.0, 0.005]
    with pytest.raises(ConfigError):
        held_out_profile(tmp_path / "nowhere", base)
    bad = tmp_path / "bad.up"
    bad.write_text("0\nfast\n")
    with pytest.raises(ConfigError):
        held_out_profile(bad, base)


def test_a_channel_can_have_its_own_offsets():
    config = load_config(ROOT / "configs/bench.yaml", BenchConfig)
    flaky = load_profile(ROOT / "configs/channels/flaky.yaml")
    starts = config.offsets_for(flaky)   # the one reader the bench and --from-generations use
    # every flaky unit meets an outage window 1 s after its start
    assert all(flaky.next_outage_start(s) - s == pytest.approx(1.0) for s in starts)
    with pytest.raises(ValueError):
        BenchConfig(channel_offsets={"flaky": 0})


def test_workers_take_the_slowest_cells_first():
    """Cells go to the workers longest expected first, so the run does not end on a long
    phone cell started last: a throttled draft and a long RTT cost more, offsets multiply."""
    from bench.matrix.cell import Cell
    from bench.matrix.workers import expected_cost

    lan, lte = (load_profile(ROOT / f"configs/channels/{n}.yaml") for n in ("lan", "lte"))
    laptop, phone = DeviceSpec(name="laptop"), DeviceSpec(name="phone", draft_tokens_per_s=40.0)
    costs = {(p.name, d.name, n): expected_cost(Cell(d, p, [0.0] * n))
             for p in (lan, lte) for d in (laptop, phone) for n in (1, 2)}
    assert costs[("lte", "phone", 1)] > costs[("lte", "laptop", 1)] > costs[("lan", "laptop", 1)]
    assert costs[("lan", "phone", 1)] > costs[("lan", "laptop", 1)]
    assert costs[("lte", "phone", 2)] == 2 * costs[("lte", "phone", 1)]
