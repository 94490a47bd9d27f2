"""The adaptive draft-length controller on synthetic links and drafts (no model, no network):
the estimators see exactly the round records a real loop would produce, from a link whose RTT
is latency + bytes / bandwidth + verifier time and a draft whose tokens are accepted with a
known probability. Each test states the behaviour and, for step changes, the reaction bound in
rounds."""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from edge.config import AdaptiveConfig, ClientConfig, DeviceProfile
from edge.control import FixedK, Plan, RoundView, make_policy, policy_names
from edge.control.acceptance import AcceptanceEstimator
from edge.control.adaptive import CLOUD_FAILED_RETRY_ROUNDS, CLOUD_RETRY_ROUNDS, AdaptivePolicy
from edge.control.link_estimate import LinkEstimator
from edge.control.costs import PREFILL_SPIKE_CAP
from edge.control.options import CLOUD_SETTLED_RUN_S, EXPLORE_EVIDENCE, STALE_EVIDENCE_TOKENS
from edge.record import RoundRecord

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


@dataclass
class Link:
    latency_s: float = 0.010
    seconds_per_byte: float = 1e-8
    server_s: float = 0.004
    jitter_s: float = 0.0


@dataclass
class Draft:
    alpha: float = 0.9              # P(accept) of each token, i.i.d.
    s_per_token: float = 0.002
    bytes_per_token: float = 3.0    # greedy ids; sampling adds ~4 B per q entry


class SimClock:
    """The policy's clock, moved by the simulated rounds."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run(policy, link: Link, draft: Draft, rounds: int, rng: random.Random, *,
        max_k: int = 32, sampling: bool = False, log=None, generated: int = 0,
        remaining: int = 10_000, first_round: int = 0):
    """Drive `rounds` rounds of a generation (a new one unless first_round > 0); returns the
    log of (plan, record). A cloud-generates plan runs as the verifier would: n tokens streamed
    one server pass apart after the latency."""
    log = [] if log is None else log
    history: list[RoundRecord] = []
    clock = getattr(policy, "clock", None)
    for _ in range(rounds):
        view = RoundView(round=first_round + len(history), generated=generated,
                         remaining=remaining, max_k=max_k, link_state="up", sampling=sampling,
                         history=history, max_q_entries=16)
        plan = policy.plan(view)
        jitter = rng.uniform(0, link.jitter_s)
        if plan.cloud_generate:
            n = min(plan.cloud_generate, remaining)
            first = link.latency_s + 10 * link.seconds_per_byte + link.server_s + jitter
            record = RoundRecord(index=len(history), k_asked=0, drafted=0, accepted=None,
                                 mode="cloud", verified=True, committed=n, target_passes=n,
                                 rtt_s=first, server_forward_s=n * link.server_s, bytes_up=10,
                                 bytes_down=8 * n)
            wall = first + (n - 1) * link.server_s
        else:
            k = min(plan.k, max_k)
            n = 0
            while n < k and rng.random() < draft.alpha:
                n += 1
            bytes_up = int(8 + k * draft.bytes_per_token)
            rtt = link.latency_s + bytes_up * link.seconds_per_byte + link.server_s + jitter
            record = RoundRecord(index=len(history), k_asked=k, drafted=k, accepted=n,
                                 mode="verify", verified=True, committed=n + 1, target_passes=1,
                                 draft_s=draft.s_per_token * k, rtt_s=rtt,
                                 sync_s=draft.s_per_token if k else 0.0, sync_tokens=1,
                                 server_forward_s=link.server_s, bytes_up=bytes_up, bytes_down=12,
                                 confidences=[0.9] * k)
            wall = record.draft_s + rtt
        if isinstance(clock, SimClock):
            clock.t += wall
        history.append(record)
        generated += record.committed
        policy.update(record)
        log.append((plan, record))
    return log


def adaptive(cap: float | None = None, **overrides) -> AdaptivePolicy:
    """The controller on a simulated clock. Cloud-generates is off unless asked for: most tests
    here are about how speculation's k follows the link and the draft."""
    device = overrides.pop("device", DeviceProfile())
    overrides.setdefault("cloud_generate", False)
    return AdaptivePolicy(ClientConfig(policy="adaptive", device=device, max_passes_per_token=cap,
                                       adaptive=AdaptiveConfig(**overrides)), clock=SimClock())


def steady_k(policy, link, draft, rng, rounds=80) -> float:
    run(policy, link, draft, rounds, rng)
    return policy.last_choice["k"]


# ---- registry and fixed k ------------------------------------------------------------------

def test_registry_builds_policies_by_name():
    assert {"fixed", "adaptive"} <= set(policy_names())
    assert isinstance(make_policy("adaptive", ClientConfig()), AdaptivePolicy)
    fixed = make_policy("fixed", ClientConfig(draft_length=6))
    view = RoundView(round=0, generated=0, remaining=100, max_k=3, link_state="up",
                     sampling=False, history=[])
    assert fixed.plan(view) == Plan(k=3)            # capped by max_k, nothing else
    assert FixedK(2).plan(view) == Plan(k=2)
    with pytest.raises(ValueError, match="unknown draft policy"):
        make_policy("nope", ClientConfig())


# ---- the controller's choices ----------------------------------------------------------------

def test_draft_speed_is_measured_per_decode_step():
    """A real draft of k tokens runs k decode steps when its sync fed one token (k - 1 after
    the sync); a long sync is a prefill and is left out of the per-token speed."""
    policy = adaptive()
    step = 0.025
    for i, k in enumerate([1, 2, 3, 5, 8, 2, 1, 4] * 4):
        prefill = i == 0
        sync_s = 0.2 if prefill else step
        policy.update(RoundRecord(index=i, k_asked=k, drafted=k, accepted=0, mode="verify",
                                  verified=True, committed=1, draft_s=sync_s + step * (k - 1),
                                  sync_s=sync_s, sync_tokens=60 if prefill else 1, rtt_s=0.02))
    assert policy.costs.t_draft() == pytest.approx(step, rel=0.02)


def _ahead_checked(policy: AdaptivePolicy) -> AdaptivePolicy:
    """Every plan that drafts ahead is one where, by the estimates it was made from, it pays."""
    plan = policy.plan

    def checked(view: RoundView) -> Plan:
        chosen = plan(view)
        assert not chosen.draft_ahead or policy.costs.ahead_pays(chosen.k)
        return chosen
    policy.plan = checked
    return policy


def test_draft_ahead_only_where_it_pays():
    """Draft-ahead is not interrupted by the verdict: a phone-speed draft (25 ms/token) on a
    2 ms link would spend on rejections far more than it hides; a fast draft on a 60 ms link
    hides its drafting entirely."""
    rng = random.Random(7)
    no_cloud = AdaptiveConfig(cloud_generate=False)
    slow_short = _ahead_checked(AdaptivePolicy(ClientConfig(policy="adaptive", draft_ahead=True,
                                                            adaptive=no_cloud)))
    run(slow_short, Link(latency_s=0.002, server_s=0.015), Draft(alpha=0.7, s_per_token=0.025),
        60, rng)
    assert not slow_short.costs.ahead_pays(4) and not slow_short.costs.ahead_pays(8)
    fast_long = _ahead_checked(AdaptivePolicy(ClientConfig(policy="adaptive", draft_ahead=True,
                                                           adaptive=no_cloud)))
    log = run(fast_long, Link(latency_s=0.060, server_s=0.015), Draft(alpha=0.7, s_per_token=0.001),
              60, rng)
    assert fast_long.costs.ahead_pays(4) and fast_long.costs.ahead_pays(8)
    assert all(plan.draft_ahead for plan, _ in log[-20:] if plan.k > 0)


def test_k_grows_with_rtt_when_acceptance_is_high():
    ks = [steady_k(adaptive(max_draft_length=32), Link(latency_s=rtt), Draft(alpha=0.9),
                   random.Random(1)) for rtt in (0.002, 0.020, 0.100)]
    assert ks[0] < ks[1] < ks[2], ks


def test_k_shrinks_when_acceptance_falls():
    ks = [steady_k(adaptive(), Link(latency_s=0.030), Draft(alpha=a), random.Random(2))
          for a in (0.95, 0.7, 0.3)]
    assert ks[0] > ks[1] > ks[2], ks


def test_k_shrinks_when_the_uplink_collapses():
    """Same latency, the uplink drops from ~100 MB/s to 500 B/s (6 ms per greedy token on the
    wire): the fitted cost per byte must grow and k fall — not read as a longer latency."""
    rng = random.Random(3)
    policy = adaptive()
    draft = Draft(alpha=0.9)
    before = steady_k(policy, Link(latency_s=0.050), draft, rng)
    after = steady_k(policy, Link(latency_s=0.050, seconds_per_byte=1 / 500), draft, rng,
                     rounds=120)
    assert policy.costs.link.seconds_per_byte > 1e-3
    assert policy.costs.link.latency_s == pytest.approx(0.050, rel=0.3)
    assert after < before, (before, after)


def test_jitter_alone_is_not_a_slow_uplink():
    rng = random.Random(4)
    policy = adaptive()
    run(policy, Link(latency_s=0.040, jitter_s=0.020), Draft(alpha=0.9), 200, rng)
    # 20 ms of jitter on ~30 B blocks would be ~1 ms/B if fitted naively.
    assert policy.costs.link.seconds_per_byte < 2e-4


def test_device_budgets_are_respected():
    rng = random.Random(5)
    link, draft = Link(latency_s=0.100), Draft(alpha=0.6)
    free = steady_k(adaptive(), link, draft, rng)
    # most draft tokens per generated token
    policy = adaptive(device=DeviceProfile(max_draft_per_generated=1.0))
    log = run(policy, link, draft, 200, rng)
    drafted = sum(r.drafted for _, r in log)
    committed = sum(r.committed for _, r in log)
    assert drafted <= 1.0 * committed and policy.last_choice["k"] < free
    # most draft tokens per second
    policy = adaptive(device=DeviceProfile(max_draft_tokens_per_s=20))
    for plan, record in run(policy, link, draft, 100, rng):
        seconds = record.draft_s + record.rtt_s
        assert record.drafted / seconds <= 20 * 1.2  # the model's T vs the link's actual one
    # joules per generated token
    device = DeviceProfile(joules_per_draft_token=0.05, joules_per_byte_up=5e-6,
                           joules_budget_per_token=0.08)
    policy = adaptive(device=device)
    log = run(policy, link, draft, 200, rng)
    joules = sum(0.05 * r.drafted + 5e-6 * r.bytes_up for _, r in log)
    assert joules / sum(r.committed for _, r in log) <= 0.08 * 1.1
    assert policy.last_choice["k"] < free


def test_confidence_stop_threshold_comes_from_the_acceptance_model():
    """Tokens drafted at confidence < 0.5 are never accepted, above 0.5 nearly always: the
    learned threshold lands between, and without such a split it stays off."""
    est = AcceptanceEstimator(alpha=0.05)
    for i in range(300):
        conf = (i % 10) / 10 + 0.05
        accepted = 2 if conf > 0.5 else 0
        est.update(RoundRecord(index=i, k_asked=3, drafted=3, accepted=accepted, mode="verify",
                               confidences=[conf, conf, conf]))
    assert 0.4 <= est.confidence_threshold(0.5) <= 0.6
    assert est.confidence_threshold(0.0) == 0.0
    flat = AcceptanceEstimator()
    assert flat.confidence_threshold(0.1) == 0.0   # the prior (0.7) clears 0.1 everywhere


def test_q_entries_follow_the_uplink():
    rng = random.Random(6)
    policy = adaptive()
    fast = run(policy, Link(latency_s=0.020), Draft(alpha=0.8, bytes_per_token=60.0), 40, rng,
               sampling=True)
    assert fast[-1][0].q_entries == 16
    slow = run(policy, Link(latency_s=0.020, seconds_per_byte=1 / 20_000),
               Draft(alpha=0.8, bytes_per_token=60.0), 80, rng, sampling=True)
    assert slow[-1][0].q_entries < 16


# ---- one controller: speculate or let the cloud generate, within a cap ----------------------

PHONE = Draft(alpha=0.75, s_per_token=0.025)     # a ~40 tok/s phone draft
LAPTOP = Draft(alpha=0.8, s_per_token=0.001)     # a fast local draft
TARGET_PASS_S = 0.015                            # one target pass (the shipped target on CPU)


def _rates(policy, link, draft, rounds=60, seed=12, **kw):
    log = run(policy, link, draft, rounds, random.Random(seed), **kw)
    tokens = sum(r.committed for _, r in log)
    seconds = sum((r.rtt_s + (r.committed - 1) * link.server_s) if r.mode == "cloud"
                  else r.draft_s + r.rtt_s for _, r in log)
    passes = sum(r.target_passes for _, r in log)
    return log, tokens / seconds, passes / tokens


def test_long_rtt_and_a_slow_draft_let_the_cloud_generate():
    """LTE-like 70 ms and a 40 tok/s draft: speculating commits ~3 tokens per ~180 ms, the
    verifier streams one every 15 ms after the latency. Speculation is far from the cloud's
    rate, so it is not worth measuring again, and the controller asks for runs of a second of
    the stream (not only long enough that the latency is 10% of them: each run pays it once
    more), and ends up as fast as cloud-only."""
    policy = adaptive(cloud_generate=True)
    link = Link(latency_s=0.070, server_s=TARGET_PASS_S)
    log, rate, _ = _rates(policy, link, PHONE)
    last = [plan for plan, _ in log[-20:]]
    assert all(plan.cloud_generate >= CLOUD_SETTLED_RUN_S / TARGET_PASS_S - 1 for plan in last)
    cloud_only = 48 / (0.070 + 48 * TARGET_PASS_S)
    assert rate >= 0.9 * cloud_only
    spec_only = adaptive()
    _, spec_rate, _ = _rates(spec_only, link, PHONE)
    assert rate > 2 * spec_rate


def test_short_rtt_and_a_fast_draft_speculate():
    """LAN (2 ms) and a fast draft: a round of ~4 committed tokens costs ~25 ms, the cloud
    ~15 ms per token: speculation, and never a cloud run once measured."""
    policy = adaptive(cloud_generate=True)
    link = Link(latency_s=0.002, server_s=TARGET_PASS_S)
    log, rate, _ = _rates(policy, link, LAPTOP)
    assert not any(plan.cloud_generate for plan, _ in log[5:])
    assert policy.last_choice["mode"] == "speculate" and policy.last_choice["k"] >= 3
    assert rate > 1.3 / TARGET_PASS_S


@pytest.mark.parametrize("latency_s, speculates", [(0.011, True), (0.060, False)])
def test_an_unlucky_first_block_does_not_end_speculation_for_good(latency_s, speculates):
    """A Wi-Fi-like 11 ms link, a fast draft (0.6 ms a token, acceptance 0.8) and an 8 ms
    target pass: speculation (~155 tok/s) beats the cloud (~115). The first block is all
    rejected (acceptance 0.7 -> 0.45 at position 0), which makes speculation look slower than
    the cloud; while the evidence is that thin the controller still tries it again, learns the
    real acceptance and speculates (before, it kept to cloud runs for good: 20 seeds of 20).
    On a 60 ms link, where even the prior's rate is far below the cloud's, it keeps to cloud
    runs: no wasted tries."""
    policy = adaptive(cloud_generate=True)
    link = Link(latency_s=latency_s, server_s=0.008)
    rng = random.Random(21)
    run(policy, link, Draft(alpha=0.0, s_per_token=0.0006), 2, rng)   # rejected blocks
    log = run(policy, link, Draft(alpha=0.8, s_per_token=0.0006), 60, rng)
    cloud_late = sum(1 for plan, _ in log[-20:] if plan.cloud_generate)
    if speculates:
        assert cloud_late <= 5 and policy.costs.acceptance.per_position()[0] > 0.6
    else:
        assert all(plan.cloud_generate for plan, _ in log)


def test_the_choice_follows_the_link():
    """The same draft (4 ms a token) and verifier (30 ms a pass): on a LAN speculation commits
    ~6 tokens per ~65 ms round; the link turns into a 300 ms one and the cloud, streaming one
    token per pass after the latency, is faster; the cloud runs measure the link too, so when
    it comes back the controller speculates again."""
    policy = adaptive(cloud_generate=True)
    rng = random.Random(13)
    draft = Draft(alpha=0.9, s_per_token=0.004)
    run(policy, Link(latency_s=0.001, server_s=0.030), draft, 40, rng)
    assert policy.last_choice["mode"] == "speculate"
    run(policy, Link(latency_s=0.300, server_s=0.030), draft, 20, rng)
    assert policy.last_choice["mode"] == "cloud"
    assert policy.costs.link.latency_s == pytest.approx(0.300, rel=0.2)
    log = run(policy, Link(latency_s=0.001, server_s=0.030), draft, 20, rng)
    assert policy.last_choice["mode"] == "speculate"
    assert not any(plan.cloud_generate for plan, _ in log[-10:])


def test_cloud_generates_only_where_the_verifier_serves_it():
    """A verifier without Generate: the loop runs the plan's k instead (a speculative round),
    and the controller asks again only CLOUD_RETRY_ROUNDS rounds later."""
    policy = adaptive(cloud_generate=True)
    link = Link(latency_s=0.070, server_s=TARGET_PASS_S)
    run(policy, link, PHONE, 10, random.Random(14))
    view = RoundView(round=5, generated=10, remaining=100, max_k=16, link_state="up",
                     sampling=False, history=[])
    plan = policy.plan(view)
    assert plan.cloud_generate > 0 and plan.k > 0  # k: the fallback, not one token per trip
    policy.update(RoundRecord(index=0, k_asked=plan.k, drafted=plan.k, accepted=1,
                              mode="verify", committed=2, target_passes=1, rtt_s=0.09,
                              draft_s=0.1, sync_tokens=1, bytes_up=20))
    log = run(policy, link, PHONE, CLOUD_RETRY_ROUNDS + 1, random.Random(15))
    assert not any(plan.cloud_generate for plan, _ in log[:CLOUD_RETRY_ROUNDS - 1])
    assert log[-1][0].cloud_generate > 0
    assert adaptive().plan(view).cloud_generate == 0  # and off when the config says so


def test_acceptance_evidence_goes_stale_and_speculation_is_measured_again():
    """A Wi-Fi-like link and a fast draft whose text turns hard (acceptance 0.1): cloud runs win
    and the evidence says so. When the text turns easy again (0.85), the old evidence is stale
    after STALE_EVIDENCE_TOKENS cloud tokens; speculation is measured again (its rate at the
    prior is within THIN_EVIDENCE_RATIO of the cloud's) and wins (before, the controller kept
    to cloud runs for good: wifi/laptop at 0.81x fixed k = 16, one hard prompt keeping it on
    cloud runs for the next four)."""
    policy = adaptive(cloud_generate=True)
    link = Link(latency_s=0.011, server_s=0.008)
    rng = random.Random(5)
    hard = run(policy, link, Draft(alpha=0.1, s_per_token=0.0006), 30, rng, remaining=48)
    assert sum(1 for plan, _ in hard[-10:] if plan.cloud_generate) >= 5
    easy = run(policy, link, Draft(alpha=0.85, s_per_token=0.0006), 40, rng, remaining=48)
    assert not any(plan.cloud_generate for plan, _ in easy[-10:])
    assert policy.last_choice["k"] >= 4


def test_each_new_prompt_measures_speculation_where_it_is_near_the_cloud():
    """A Wi-Fi-like link and a fast laptop draft: speculation at the prior acceptance is near
    the cloud's rate, so a generation (a new prompt, whose text the evidence is not about)
    starts with NEW_TEXT_BLOCKS blocks before a long cloud run. Hard prompts: they are rejected
    and the rest of each generation is one cloud run. Easy prompts next: each starts with those
    blocks, and within a few the controller speculates throughout (before, easy prompts started
    with cloud runs on the hard prompts' evidence: wifi/laptop 0.79x fixed k = 16). A phone
    draft, far slower than the cloud, never spends them."""
    policy = adaptive(cloud_generate=True)
    link = Link(latency_s=0.011, server_s=0.008)
    rng = random.Random(21)
    run(policy, link, Draft(alpha=0.1, s_per_token=0.0006), 3, rng, remaining=48)
    for _ in range(8):
        hard = run(policy, link, Draft(alpha=0.1, s_per_token=0.0006), 3, rng, remaining=48)
        assert [bool(plan.cloud_generate) for plan, _ in hard] == [False, False, True]
        assert hard[0][0].k > 0 and hard[1][0].k > 0
    acceptance = policy.costs.acceptance
    # the evidence is neither thin nor stale (the run is settled: the rest of the generation),
    # so only the new text makes the easy prompt's first block worth it
    assert acceptance.observations() >= EXPLORE_EVIDENCE and hard[2][0].cloud_generate == 48
    assert acceptance.unchecked < STALE_EVIDENCE_TOKENS
    easy = [run(policy, link, Draft(alpha=0.9, s_per_token=0.0006), 4, rng, remaining=48)
            for _ in range(6)]
    assert all(plan.k > 0 and not plan.cloud_generate for log in easy for plan, _ in log[:2])
    assert not any(plan.cloud_generate for log in easy[-2:] for plan, _ in log)

    phone = adaptive(cloud_generate=True)
    run(phone, link, PHONE, 4, random.Random(22), remaining=48)
    for seed in range(3):
        log = run(phone, link, PHONE, 3, random.Random(23 + seed), remaining=48)
        assert all(plan.cloud_generate == 48 for plan, _ in log)


def test_a_k0_round_is_not_worth_measuring():
    """LAN and a slow phone draft: the cloud is faster than speculating, and the best
    speculation is k = 0 (one target token per round trip), which has nothing to measure that a
    cloud run does not: the controller keeps to whole cloud runs (before, it went back to a k = 0
    round after every two runs: lan/phone at 0.92x cloud-only)."""
    policy = adaptive(cloud_generate=True)
    log = run(policy, Link(latency_s=0.002, server_s=0.010), PHONE, 30, random.Random(3),
              remaining=48)
    assert all(plan.cloud_generate == 48 for plan, _ in log[-20:])


@pytest.mark.parametrize("case", ["stall", "cut", "reopen"])
def test_an_outage_is_not_the_clouds_pace(case):
    """An outage met by a cloud run: its stream stands still for 3 s (stall), the link cuts it
    (its wall time is the 3 s stall detection), or the run first re-opens the link for 4 s
    (reopen). The cloud's pace and cost stay what the stream does when it flows, and the
    controller keeps to cloud runs (before, one such run made the cloud look several times
    slower, and speculation, never measuring it again, ran on: flaky/laptop at 0.11x
    cloud-only)."""
    policy = adaptive(cloud_generate=True)
    link = Link(latency_s=0.070, server_s=TARGET_PASS_S)
    run(policy, link, PHONE, 20, random.Random(18))
    assert policy.last_choice["mode"] == "cloud"
    pace, cost = policy.costs.gen_seconds(), policy.costs.cloud_seconds(30)
    view = RoundView(round=20, generated=0, remaining=10_000, max_k=16, link_state="up",
                     sampling=False, history=[])
    assert policy.plan(view).cloud_generate
    n = 12 if case == "cut" else 30
    gaps = [TARGET_PASS_S] * (n - 1)
    if case == "stall":
        gaps[5] = 3.0
    first = link.latency_s + link.server_s
    outside = {"stall": 0.0, "cut": 3.0, "reopen": 4.0}[case]
    policy.clock.t += first + sum(gaps) + outside
    policy.update(RoundRecord(index=20, k_asked=0, drafted=0, accepted=None, mode="cloud",
                              verified=True, committed=n, target_passes=n, rtt_s=first,
                              server_forward_s=n * link.server_s, bytes_up=10, gaps_s=gaps,
                              cut=case == "cut", open_s=outside if case == "reopen" else 0.0))
    assert policy.costs.gen_seconds() == pytest.approx(pace, rel=0.1)
    assert policy.costs.cloud_seconds(30) == pytest.approx(cost, rel=0.1)
    log = run(policy, link, PHONE, 10, random.Random(19))
    assert all(plan.cloud_generate for plan, _ in log)


@pytest.mark.parametrize("cap", [None, 0.30])
def test_a_fresh_controller_starts_with_a_short_cloud_run(cap):
    """Nothing measured yet: a cloud run of cloud_generate_tokens measures the link and the
    cloud's pace while committing them (a k = 0 round would commit one token), and is never far
    from the best choice. Under a cap there is no surplus of passes to pay for it yet: the first
    round speculates. On a LAN with a fast draft the next rounds speculate."""
    policy = adaptive(cap, cloud_generate=True)
    view = RoundView(round=0, generated=0, remaining=48, max_k=16, link_state="up",
                     sampling=False, history=[])
    first = policy.plan(view)
    assert first.cloud_generate == (0 if cap else policy.cfg.cloud_generate_tokens)
    assert policy.prefill_first == (cap is not None)
    log = run(policy, Link(latency_s=0.002, server_s=TARGET_PASS_S), LAPTOP, 10,
              random.Random(20))
    assert not any(plan.cloud_generate for plan, _ in log[2:])


def test_a_cloud_run_that_committed_nothing_is_retried_after_a_few_rounds():
    """A cloud run evicted (or cut off) before its first token: a few speculative rounds, whose
    re-opens back off on evictions, then cloud runs again (a verifier that evicts every Generate
    cannot hold the loop in a cycle of re-opens)."""
    policy = adaptive(cloud_generate=True)
    link = Link(latency_s=0.070, server_s=TARGET_PASS_S)
    run(policy, link, PHONE, 10, random.Random(16))
    view = RoundView(round=10, generated=10, remaining=100, max_k=16, link_state="up",
                     sampling=False, history=[])
    plan = policy.plan(view)
    assert plan.cloud_generate > 0
    policy.update(RoundRecord(index=10, k_asked=0, drafted=0, accepted=None, mode="cloud",
                              verified=True, committed=0))
    log = run(policy, link, PHONE, CLOUD_FAILED_RETRY_ROUNDS + 1, random.Random(17))
    assert not any(plan.cloud_generate for plan, _ in log[:CLOUD_FAILED_RETRY_ROUNDS - 1])
    assert log[-1][0].cloud_generate > 0


@pytest.mark.parametrize("link, draft", [
    (Link(latency_s=0.070, server_s=TARGET_PASS_S), PHONE),
    (Link(latency_s=0.002, server_s=TARGET_PASS_S), LAPTOP),
    (Link(latency_s=0.200, server_s=TARGET_PASS_S), Draft(alpha=0.8, s_per_token=0.002)),
])
def test_the_cap_keeps_passes_per_token_under_it(link, draft):
    """max_passes_per_token 0.30: no cloud run the running surplus cannot pay for, speculation
    long enough to commit >= 1 / 0.30 tokens per pass on average; as fast as it can within that
    (at least the best fixed k that keeps the cap, within noise)."""
    capped = adaptive(cap=0.30, cloud_generate=True)
    _, rate, passes = _rates(capped, link, draft, rounds=300, remaining=48)
    assert passes <= 0.30
    best_fixed = 0.0
    for k in range(1, 17):
        _, fixed_rate, fixed_passes = _rates(FixedK(k), link, draft, rounds=300, remaining=48)
        if fixed_passes <= 0.30:
            best_fixed = max(best_fixed, fixed_rate)
    assert rate >= 0.95 * best_fixed, (rate, best_fixed)
    free = adaptive(cloud_generate=True)
    _, free_rate, _ = _rates(free, link, draft, rounds=300, remaining=48)
    # the cap can only cost speed (the free controller's flat tolerance and downward dither
    # trade up to ~5% for shorter blocks, which the capped one does not)
    assert free_rate >= 0.9 * rate


def test_an_unreachable_cap_spends_the_fewest_passes():
    """Acceptance 0.3 cannot commit 1 / 0.1 tokens per pass: the controller drafts the block
    with the most expected tokens per pass and never lets the cloud generate."""
    policy = adaptive(cap=0.10, cloud_generate=True)
    log = run(policy, Link(latency_s=0.070, server_s=TARGET_PASS_S), Draft(alpha=0.3), 80,
              random.Random(15))
    assert not any(plan.cloud_generate for plan, _ in log)
    assert policy.last_choice["k"] >= 8


# ---- reaction to step changes (bounds stated here) --------------------------------------------

RTT_REACTION_ROUNDS = 12         # rtt_alpha 0.3: 1 - 0.7^12 = 98.6% of the step absorbed
ACCEPTANCE_REACTION_ROUNDS = 40  # acceptance_alpha 0.1, counts at steady state: 0.9^40 = 1.5%


def _crossing_round(ks: list[int], before: int, final: int) -> int:
    """Rounds until k is past the midpoint between its old and its new steady value for good
    (acceptance is random and the rate is flat near its optimum, so k wanders around `final`;
    the midpoint is what a reaction must cross)."""
    mid = (before + final) / 2
    on_new_side = [(k > mid) == (final > mid) for k in ks]
    last_bad = max((i for i, ok in enumerate(on_new_side) if not ok), default=-1)
    return last_bad + 1


def _step(policy, link_before, draft_before, link_after, draft_after, warm, after, seed):
    rng = random.Random(seed)
    run(policy, link_before, draft_before, warm, rng)
    k_before = policy.last_choice["k"]
    ks = []
    for i in range(after):
        run(policy, link_after, draft_after, 1, rng, first_round=warm + i)
        ks.append(policy.last_choice["k"])
    final = sorted(ks[-30:])[15]  # the median of the last 30 rounds
    assert abs(final - k_before) >= 4, "the step must matter for the test to mean anything"
    return ks, k_before, final


@pytest.mark.parametrize("before, after", [(0.005, 0.150), (0.150, 0.005)])
def test_reaction_to_an_rtt_step_is_bounded(before, after):
    policy = adaptive(max_draft_length=32)
    draft = Draft(alpha=0.9)
    ks, k_before, final = _step(policy, Link(latency_s=before), draft, Link(latency_s=after),
                                draft, warm=100, after=100, seed=8)
    assert _crossing_round(ks, k_before, final) <= RTT_REACTION_ROUNDS, ks
    # and the estimate itself: within 10% of the step after 7 rounds (0.7^7 = 8%)
    probe = adaptive()
    rng = random.Random(1)
    run(probe, Link(latency_s=before), draft, 50, rng)
    run(probe, Link(latency_s=after), draft, 7, rng)
    assert abs(probe.costs.link.latency_s - after) <= 0.1 * abs(after - before)


@pytest.mark.parametrize("before, after", [(0.9, 0.4), (0.4, 0.9)])
def test_reaction_to_an_acceptance_step_is_bounded(before, after):
    policy = adaptive()
    link = Link(latency_s=0.050)
    ks, k_before, final = _step(policy, link, Draft(alpha=before), link, Draft(alpha=after),
                                warm=200, after=150, seed=9)
    assert _crossing_round(ks, k_before, final) <= ACCEPTANCE_REACTION_ROUNDS, ks


def test_link_estimator_state():
    est = LinkEstimator()
    assert est.state == "up" and not est.measured
    est.update(RoundRecord(index=0, k_asked=1, drafted=1, accepted=None, mode="local"))
    assert est.state == "down"
    est.update(RoundRecord(index=1, k_asked=1, drafted=1, accepted=1, mode="verify",
                           rtt_s=0.02, bytes_up=20, attempts=2))
    assert est.state == "degraded" and est.losses == 1


def test_acceptance_prior_persists_between_sessions(tmp_path):
    path = tmp_path / "prior.json"
    first = adaptive(prior_path=path)
    run(first, Link(latency_s=0.030), Draft(alpha=0.3), 64, random.Random(10))  # saves at 32, 64
    assert path.is_file()
    second = adaptive(prior_path=path)  # a new session starts from what the first learned
    assert second.costs.acceptance.per_position()[0] == pytest.approx(
        first.costs.acceptance.per_position()[0], abs=0.05)
    fresh = adaptive().costs.acceptance
    assert second.costs.acceptance.per_position()[0] < 0.5 < fresh.per_position()[0]
    path.write_text("not json")
    assert adaptive(prior_path=path).costs.acceptance.observations() == 0  # ignored, with a warning


def test_a_slow_draft_means_k_zero_and_probes_find_it_fast_again():
    """A draft that costs more than it saves gets k = 0; its speed is only measured while it
    drafts, so the controller probes with one token every few k = 0 rounds and recovers."""
    rng = random.Random(11)
    policy = adaptive()
    link = Link(latency_s=0.010)
    run(policy, link, Draft(alpha=0.5, s_per_token=0.100), 40, rng)
    assert policy.last_choice["k"] == 0
    log = run(policy, link, Draft(alpha=0.9, s_per_token=0.001), 30, rng)
    assert any(plan.k == 1 for plan, _ in log[:6])  # a probe within PROBE_AFTER_ZERO_ROUNDS + 1
    assert policy.last_choice["k"] >= 3


def test_the_draft_is_not_prefilled_for_a_generation_the_cloud_will_write():
    """prefill_first (edge/generation.py asks it before a generation): not after choosing cloud runs,
    even when the generation ended on a one-token round (no cloud run possible there); the
    deferred prefill is charged to speculation's first round. A fresh controller starts with a
    cloud run (test_a_fresh_controller_starts_with_a_short_cloud_run), so it does not prefill
    either; one that may not let the cloud generate does."""
    assert adaptive(cloud_generate=False).prefill_first
    policy = adaptive(cloud_generate=True)
    assert not policy.prefill_first
    run(policy, Link(latency_s=0.070, server_s=TARGET_PASS_S), PHONE, 10, random.Random(16),
        remaining=48)
    assert policy.last_choice["mode"] == "cloud" and not policy.prefill_first
    last = RoundView(round=3, generated=47, remaining=1, max_k=0, link_state="up",
                     sampling=False, history=[])
    assert policy.plan(last).cloud_generate == 0 and not policy.prefill_first
    first = RoundView(round=0, generated=0, remaining=48, max_k=32, link_state="up",
                      sampling=False, history=[], context_length=300)
    policy.plan(first)
    assert policy.costs.unsynced == 300 and policy.costs.sync_seconds() > 0


def test_a_prefill_spike_counts_at_most_twice_the_estimate():
    """Only speculation measures the draft's prefill, so one slow prefill (a moment of
    contention) priced into every generation's first block could keep speculation from being
    tried, and so measured, again: a sample counts at most PREFILL_SPIKE_CAP times the
    estimate, and a fast one brings it down at once."""
    costs = adaptive().costs

    def synced(seconds: float) -> RoundRecord:  # a block after a 100-token prefill
        return RoundRecord(index=0, k_asked=4, drafted=4, accepted=2, mode="verify",
                           committed=3, target_passes=1, rtt_s=0.02, draft_s=seconds + 0.004,
                           sync_s=seconds, sync_tokens=100, bytes_up=20)

    costs.observe(synced(0.02), None, None)                         # 200 us a token
    costs.observe(synced(0.50), None, None)                         # a 25x spike
    assert costs.prefill_s.value == pytest.approx(
        0.0002 * (1 + costs.alpha * (PREFILL_SPIKE_CAP - 1)))
    costs.observe(synced(0.02), None, None)
    assert costs.prefill_s.value < 0.0002 * 1.1
