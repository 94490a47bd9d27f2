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
from edge.control.adaptive import AdaptivePolicy
from edge.control.channel import ChannelEstimator
from edge.rounds import RoundRecord


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


def run(policy, link: Link, draft: Draft, rounds: int, rng: random.Random, *,
        max_k: int = 32, sampling: bool = False, log=None, generated: int = 0):
    """Drive `rounds` rounds; returns the log of (plan, record)."""
    log = [] if log is None else log
    history: list[RoundRecord] = []
    for _ in range(rounds):
        view = RoundView(round=len(history), generated=generated, remaining=10_000, max_k=max_k,
                         link_state="up", sampling=sampling, history=history, max_q_entries=16)
        plan = policy.plan(view)
        k = min(plan.k, max_k)
        n = 0
        while n < k and rng.random() < draft.alpha:
            n += 1
        bytes_up = int(8 + k * draft.bytes_per_token)
        rtt = (link.latency_s + bytes_up * link.seconds_per_byte + link.server_s
               + rng.uniform(0, link.jitter_s))
        record = RoundRecord(index=len(history), k_asked=k, drafted=k, accepted=n,
                             mode="verify", verified=True, committed=n + 1, target_passes=1,
                             draft_s=draft.s_per_token * k, rtt_s=rtt,
                             sync_s=draft.s_per_token if k else 0.0, sync_tokens=1,
                             server_forward_s=link.server_s, bytes_up=bytes_up, bytes_down=12,
                             confidences=[0.9] * k)
        history.append(record)
        generated += n + 1
        policy.update(record)
        log.append((plan, record))
    return log


def adaptive(**overrides) -> AdaptivePolicy:
    device = overrides.pop("device", DeviceProfile())
    return AdaptivePolicy(ClientConfig(policy="adaptive", device=device,
                                       adaptive=AdaptiveConfig(**overrides)))


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
    assert policy.t_draft() == pytest.approx(step, rel=0.02)


def test_draft_ahead_only_where_it_pays():
    """Draft-ahead is not interrupted by the verdict: a phone-speed draft (25 ms/token) on a
    2 ms link would spend on rejections far more than it hides; a fast draft on a 60 ms link
    hides its drafting entirely. Every plan that drafts ahead is one where it pays."""
    rng = random.Random(7)
    slow_short = AdaptivePolicy(ClientConfig(policy="adaptive", draft_ahead=True))
    log = run(slow_short, Link(latency_s=0.002, server_s=0.015), Draft(alpha=0.7, s_per_token=0.025),
              60, rng)
    assert not slow_short.ahead_pays(4) and not slow_short.ahead_pays(8)
    assert all(slow_short.ahead_pays(plan.k) for plan, _ in log[-20:] if plan.draft_ahead)
    fast_long = AdaptivePolicy(ClientConfig(policy="adaptive", draft_ahead=True))
    log = run(fast_long, Link(latency_s=0.060, server_s=0.015), Draft(alpha=0.7, s_per_token=0.001),
              60, rng)
    assert fast_long.ahead_pays(4) and fast_long.ahead_pays(8)
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
    assert policy.channel.seconds_per_byte > 1e-3
    assert policy.channel.latency_s == pytest.approx(0.050, rel=0.3)
    assert after < before, (before, after)


def test_jitter_alone_is_not_a_slow_uplink():
    rng = random.Random(4)
    policy = adaptive()
    run(policy, Link(latency_s=0.040, jitter_s=0.020), Draft(alpha=0.9), 200, rng)
    # 20 ms of jitter on ~30 B blocks would be ~1 ms/B if fitted naively.
    assert policy.channel.seconds_per_byte < 2e-4


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


def test_cloud_generates_when_speculation_does_not_pay():
    rng = random.Random(7)
    policy = adaptive(cloud_generate=True)
    run(policy, Link(latency_s=0.020), Draft(alpha=0.05, s_per_token=0.05), 60, rng)
    view = RoundView(round=5, generated=10, remaining=100, max_k=16, link_state="up",
                     sampling=False, history=[])
    assert policy.plan(view).cloud_generate > 0
    good = adaptive(cloud_generate=True)
    run(good, Link(latency_s=0.020), Draft(alpha=0.9), 60, rng)
    assert good.plan(view).cloud_generate == 0


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
    for _ in range(after):
        run(policy, link_after, draft_after, 1, rng)
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
    assert abs(probe.channel.latency_s - after) <= 0.1 * abs(after - before)


@pytest.mark.parametrize("before, after", [(0.9, 0.4), (0.4, 0.9)])
def test_reaction_to_an_acceptance_step_is_bounded(before, after):
    policy = adaptive()
    link = Link(latency_s=0.050)
    ks, k_before, final = _step(policy, link, Draft(alpha=before), link, Draft(alpha=after),
                                warm=200, after=150, seed=9)
    assert _crossing_round(ks, k_before, final) <= ACCEPTANCE_REACTION_ROUNDS, ks


def test_channel_estimator_state():
    est = ChannelEstimator()
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
    assert second.acceptance.per_position()[0] == pytest.approx(
        first.acceptance.per_position()[0], abs=0.05)
    assert second.acceptance.per_position()[0] < 0.5 < adaptive().acceptance.per_position()[0]
    path.write_text("not json")
    assert adaptive(prior_path=path).acceptance.observations() == 0  # ignored, with a warning


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
