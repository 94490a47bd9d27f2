"""Property-based tests (hypothesis) of the wire codec and the verification functions.

Each property holds for every input hypothesis draws (derandomized, so CI is reproducible):
- quantize: any probability vector becomes a valid sparse q that keeps the most likely id and
  survives the proto round trip exactly; NaN, infinite, negative or zero-mass input is refused,
  never turned into a token.
- SparseDist.validate: any ids/weights a peer can put on the wire are either a proper
  distribution (then dense() sums to 1 and agrees with prob_of) or refused with
  InvalidDistribution, never another exception.
- verify_greedy: the accepted length is the common prefix with the target's argmax and the
  bonus token is the argmax right after it.
- verify_sampled_with_uniforms: agrees with the plain-Python reference of Leviathan et al.
  Algorithm 1 on the accepted length; the bonus token always has mass in the distribution it is
  drawn from; a zero q at a drafted token and a distribution without mass are refused.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_verify import reference_verify

from cloud.errors import InvalidRequest, ZeroDraftProbability
from cloud.verify import sample_inverse_cdf, verify_greedy, verify_sampled_with_uniforms
from tandem.codec import InvalidDistribution, SparseDist, from_proto, quantize, to_proto
from tandem.v1 import decoding_pb2 as pb

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

PROFILE = settings(max_examples=200, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow])

probabilities = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=64).filter(
    lambda xs: sum(xs) > 0)
uint32 = st.integers(0, 2**32 - 1)


# --- codec -----------------------------------------------------------------------------------------
@PROFILE
@given(probs=probabilities, max_entries=st.integers(1, 32), scale=st.integers(1, 2**20))
def test_quantize_gives_a_valid_q_that_keeps_the_argmax_and_round_trips(probs, max_entries, scale):
    vocab = len(probs)
    dist = quantize(torch.tensor(probs, dtype=torch.float64), max_entries, scale)
    dist.validate(vocab, max_entries)
    assert int(np.argmax(probs)) in dist.ids or probs[int(dist.ids[0])] == max(probs)
    assert dist.weights.max() <= scale
    message = pb.SparseDistribution()
    to_proto(dist, message)
    again = from_proto(pb.SparseDistribution.FromString(message.SerializeToString()))
    assert again.ids.tolist() == dist.ids.tolist()
    assert again.weights.tolist() == dist.weights.tolist()
    assert math.isclose(float(again.dense(vocab).sum()), 1.0, rel_tol=1e-9)


@PROFILE
@given(probs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=16),
       poison=st.sampled_from([math.nan, math.inf, -math.inf, -0.5, "zero"]),
       at=st.integers(0, 15))
def test_quantize_refuses_nan_infinite_negative_and_empty_input(probs, poison, at):
    probs = list(probs)
    if poison == "zero":
        probs = [0.0] * len(probs)
    else:
        probs[at % len(probs)] = poison
    with pytest.raises(InvalidDistribution):
        quantize(torch.tensor(probs, dtype=torch.float64))


@PROFILE
@given(ids=st.lists(uint32, max_size=20), weights=st.lists(uint32, max_size=20),
       vocab=st.integers(1, 5000), max_entries=st.integers(1, 24))
def test_validate_accepts_exactly_proper_distributions(ids, weights, vocab, max_entries):
    message = pb.SparseDistribution(ids=ids, weights=weights)
    dist = from_proto(pb.SparseDistribution.FromString(message.SerializeToString()))
    proper = (0 < len(ids) == len(weights) <= max_entries and len(set(ids)) == len(ids)
              and max(ids) < vocab and min(weights) > 0)
    if not proper:
        with pytest.raises(InvalidDistribution):
            dist.validate(vocab, max_entries)
        return
    dist.validate(vocab, max_entries)
    dense = dist.dense(vocab)
    assert math.isclose(float(dense.sum()), 1.0, rel_tol=1e-9)
    for token in ids:
        assert math.isclose(dist.prob_of(token), float(dense[token]), rel_tol=1e-9)
    assert (dense > 0).sum() == len(ids)


# --- verification ------------------------------------------------------------------------------
@st.composite
def greedy_cases(draw):
    vocab = draw(st.integers(2, 12))
    k = draw(st.integers(0, 6))
    targets = draw(st.lists(st.integers(0, vocab - 1), min_size=k + 1, max_size=k + 1))
    draft = [t if draw(st.booleans()) else draw(st.integers(0, vocab - 1)) for t in targets[:k]]
    return vocab, draft, targets


@PROFILE
@given(case=greedy_cases())
def test_greedy_accepts_the_common_prefix_then_the_targets_token(case):
    vocab, draft, targets = case
    logits = torch.full((len(targets), vocab), -1.0)
    logits[torch.arange(len(targets)), torch.tensor(targets)] = 3.0
    verdict = verify_greedy(torch.tensor(draft, dtype=torch.long), logits)
    n = next((i for i, (d, t) in enumerate(zip(draft, targets)) if d != t), len(draft))
    assert (verdict.accepted, verdict.token) == (n, targets[n])


@st.composite
def sampled_cases(draw):
    vocab = draw(st.integers(2, 8))
    k = draw(st.integers(0, 4))
    weight = st.floats(0.0, 1.0, allow_nan=False)

    def dist(positive_at=None):
        w = draw(st.lists(weight, min_size=vocab, max_size=vocab))
        if positive_at is not None and w[positive_at] < 1e-6:
            w[positive_at] = 0.5  # a drafted token has q > 0 (denormals would flush to 0)
        if sum(w) == 0.0:
            w[0] = 1.0
        total = sum(w)
        return [x / total for x in w]

    draft = draw(st.lists(st.integers(0, vocab - 1), min_size=k, max_size=k))
    q = [dist(positive_at=x) for x in draft]
    p = [dist() for _ in range(k + 1)]
    uniforms = draw(st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=k + 1,
                             max_size=k + 1))
    return draft, q, p, uniforms


@PROFILE
@given(case=sampled_cases())
def test_rejection_sampling_agrees_with_the_reference_and_never_emits_a_massless_token(case):
    draft, q, p, uniforms = case
    k = len(draft)
    verdict = verify_sampled_with_uniforms(
        torch.tensor(draft, dtype=torch.long), torch.tensor(q, dtype=torch.float64).reshape(k, len(p[0])),
        torch.tensor(p, dtype=torch.float64), torch.tensor(uniforms, dtype=torch.float64))
    n, _ = reference_verify(draft, q, p, uniforms)
    assert verdict.accepted == n
    # The bonus token comes from the residual max(0, p - q) after a rejection (p itself if that
    # has no mass), or from p[k] after a full accept: it always has mass there.
    if n < k:
        residual = [max(0.0, a - b) for a, b in zip(p[n], q[n])]
        source = residual if sum(residual) > 0 else p[n]
    else:
        source = p[k]
    assert source[verdict.token] > 0


@PROFILE
@given(case=sampled_cases(), at=st.integers(0, 3))
def test_rejection_sampling_refuses_a_zero_q_at_a_drafted_token(case, at):
    draft, q, p, uniforms = case
    if not draft:
        return
    i = at % len(draft)
    q[i][draft[i]] = 0.0
    with pytest.raises(ZeroDraftProbability):
        verify_sampled_with_uniforms(
            torch.tensor(draft, dtype=torch.long), torch.tensor(q, dtype=torch.float64),
            torch.tensor(p, dtype=torch.float64), torch.tensor(uniforms, dtype=torch.float64))


@PROFILE
@given(weights=st.lists(st.sampled_from([0.0, math.nan, -1.0]), min_size=1, max_size=8),
       u=st.floats(0.0, 1.0, exclude_max=True))
def test_a_distribution_without_mass_is_refused_never_sampled(weights, u):
    with pytest.raises(InvalidRequest):
        sample_inverse_cdf(torch.tensor(weights, dtype=torch.float64), u)


@PROFILE
@given(weights=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=16).filter(
    lambda w: sum(w) > 0), u=st.floats(0.0, 1.0, exclude_max=True))
def test_inverse_cdf_returns_an_id_with_mass(weights, u):
    token = sample_inverse_cdf(torch.tensor(weights, dtype=torch.float64), u)
    assert weights[token] > 0


def test_sparse_dist_sample_draws_only_listed_ids():
    dist = SparseDist(ids=np.array([3, 9], dtype=np.int64), weights=np.array([1, 1000]))
    generator = torch.Generator().manual_seed(0)
    assert {dist.sample(generator) for _ in range(200)} <= {3, 9}
