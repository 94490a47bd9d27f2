"""The coded draft q (tandem/qcodec.py), as properties (hypothesis, derandomized) and on the
shipped draft's own distributions:

- quantize: any probability vector becomes a valid q on the codec's grid (at most CAP entries,
  weights from WEIGHTS, non-increasing) that keeps the most likely id; bad input is refused;
- round trip: any block of such q, each with any of its ids as the drafted token, decodes to
  exactly the same ids and weights in the same order (so the q the draft sampled from is the q
  the verifier tests), with the shipped prior and with a uniform one;
- hostile bytes: any payload either decodes to valid q (each listing its token) or is refused
  with InvalidDistribution, never another exception; a valid payload cut short, padded or with
  a word flipped is refused unless it is exactly the encoding of another block;
- the shipped draft on held-out prompts: every q it makes round-trips, and a block costs far
  fewer bytes than the plain SparseDistribution messages.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verifier_harness import edge_tokenizer, prompt_ids  # noqa: F401 (fixtures)

from tandem.codec import InvalidDistribution, SparseDist, to_proto
from tandem.qcodec import CAP, MAX_CODED_BYTES_PER_TOKEN, WEIGHTS, QCodec, codec_for, \
    load_prior, uniform_prior
from tandem.sampling import SamplingParams, warp
from tandem.v1 import decoding_pb2 as pb

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

PROFILE = settings(max_examples=200, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow])
SHIPPED_FINGERPRINT = "sha256:a4d321229c99f72f2c3dc7f857405145"
VOCAB = 4096
SHIPPED = codec_for(SHIPPED_FINGERPRINT, VOCAB)
UNIFORM = QCodec(uniform_prior(VOCAB))

# Probability vectors over the full vocabulary: a few dozen listed ids (flat or peaked), the
# rest zero, as the draft's warped distributions look after top-k / top-p.
sparse_probs = st.lists(st.tuples(st.integers(0, VOCAB - 1),
                                  st.floats(0.0, 1.0, allow_nan=False)),
                        min_size=1, max_size=48).filter(lambda xs: sum(p for _, p in xs) > 0)


def _dense(pairs) -> torch.Tensor:
    probs = torch.zeros(VOCAB, dtype=torch.float64)
    for i, p in pairs:
        probs[i] += p
    return probs


def _same(a: list[SparseDist], b: list[SparseDist]) -> bool:
    return len(a) == len(b) and all(x.ids.tolist() == y.ids.tolist() and
                                    x.weights.tolist() == y.weights.tolist() for x, y in zip(a, b))


def test_the_shipped_prior_is_found_and_named_by_its_digest():
    prior = load_prior(SHIPPED_FINGERPRINT, VOCAB)
    assert prior.source.endswith(".npy") and prior.vocab_size == VOCAB
    assert SHIPPED.name.startswith(f"ans1:{VOCAB}:") and SHIPPED.name != UNIFORM.name
    assert codec_for("sha256:unknown", 100).prior.source == "uniform"


@PROFILE
@given(pairs=sparse_probs, max_entries=st.integers(1, 40))
def test_quantize_gives_a_q_on_the_grid_that_keeps_the_argmax(pairs, max_entries):
    probs = _dense(pairs)
    dist = SHIPPED.quantize(probs, max_entries)
    dist.validate(VOCAB, min(max_entries, CAP))
    assert SHIPPED.encodable(dist)
    assert probs[int(dist.ids[0])] == probs.max()
    assert set(dist.weights.tolist()) <= set(WEIGHTS) and dist.weights[0] == WEIGHTS[0]
    assert all(probs[int(i)] > 0 for i in dist.ids)


@PROFILE
@given(probs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=16),
       poison=st.sampled_from([math.nan, math.inf, -0.5, "zero"]), at=st.integers(0, 15))
def test_quantize_refuses_bad_input(probs, poison, at):
    probs = [0.0] * len(probs) if poison == "zero" else list(probs)
    if poison != "zero":
        probs[at % len(probs)] = poison
    with pytest.raises(InvalidDistribution):
        SHIPPED.quantize(torch.tensor(probs, dtype=torch.float64))


@PROFILE
@given(block=st.lists(st.tuples(sparse_probs, st.integers(1, CAP), st.integers(0, 2**16)),
                      min_size=1, max_size=8),
       uniform=st.booleans())
def test_any_block_the_draft_can_make_round_trips_exactly(block, uniform):
    codec = UNIFORM if uniform else SHIPPED
    q = [codec.quantize(_dense(pairs), m) for pairs, m, _ in block]
    tokens = [int(d.ids[pick % len(d.ids)]) for d, (_, _, pick) in zip(q, block)]
    data = codec.encode(tokens, q)
    assert len(data) % 4 == 0 and len(data) <= MAX_CODED_BYTES_PER_TOKEN * (len(tokens) + 1)
    assert _same(codec.decode(data, tokens), q)


def test_a_flipped_word_the_coder_cannot_decode_is_refused():
    """Found by a random run of the flip test below: constriction raises AssertionError for
    data its model cannot decode; it must come out as InvalidDistribution (INVALID_ARGUMENT)."""
    pairs = [[(1984, 0.69), (370, 0.46), (1290, 0.27), (29, 0.26), (2694, 0.97), (2650, 0.24),
              (2535, 0.22), (1498, 0.5), (3126, 0.08), (2284, 0.5), (1646, 0.25)],
             [(40, 0.09), (735, 0.14), (341, 0.39), (2454, 0.3), (1907, 0.08), (1271, 0.66),
              (3190, 0.76), (4048, 0.15), (1185, 0.04), (3516, 0.73), (1141, 0.91), (131, 0.83),
              (1883, 0.09), (342, 0.13)]]
    q = [SHIPPED.quantize(_dense(p)) for p in pairs]
    tokens = [int(d.ids[-1]) for d in q]
    words = np.frombuffer(SHIPPED.encode(tokens, q), dtype="<u4").copy()
    words[2] ^= np.uint32(1)  # the model cannot decode this word: constriction asserts
    with pytest.raises(InvalidDistribution, match="undecodable"):
        SHIPPED.decode(words.tobytes(), tokens)


@PROFILE
@given(data=st.binary(max_size=64), tokens=st.lists(st.integers(0, VOCAB - 1), max_size=6))
def test_any_bytes_decode_to_valid_q_or_are_refused(data, tokens):
    try:
        q = SHIPPED.decode(data, tokens)
    except InvalidDistribution:
        return
    assert len(q) == len(tokens)
    for token, dist in zip(tokens, q):
        dist.validate(VOCAB, CAP)
        assert dist.prob_of(token) > 0 and SHIPPED.encodable(dist)
    assert SHIPPED.encode(tokens, q) == data  # only a canonical encoding is accepted


@PROFILE
@given(pairs=st.lists(sparse_probs, min_size=1, max_size=4), cut=st.integers(1, 8),
       flip=st.integers(0, 2**32 - 1), at=st.integers(0, 63))
def test_cut_padded_or_flipped_payloads_are_refused(pairs, cut, flip, at):
    q = [SHIPPED.quantize(_dense(p)) for p in pairs]
    tokens = [int(d.ids[-1]) for d in q]
    data = SHIPPED.encode(tokens, q)
    for bad in (data[:-min(cut, len(data))], data + bytes(cut), data + b"\x01\x00\x00\x00"):
        with pytest.raises(InvalidDistribution):
            SHIPPED.decode(bad, tokens)
    words = np.frombuffer(data, dtype="<u4").copy()
    words[at % len(words)] ^= np.uint32(flip or 1)
    try:
        other = SHIPPED.decode(words.tobytes(), tokens)
    except InvalidDistribution:
        return
    assert not _same(other, q)  # another block's exact encoding, never this one misread


def test_a_token_the_decoder_cannot_hold_is_refused():
    dist = SHIPPED.quantize(_dense([(5, 0.5), (7, 0.3)]))
    data = SHIPPED.encode([5], [dist])
    with pytest.raises(InvalidDistribution, match="outside the coded vocabulary"):
        SHIPPED.decode(data, [VOCAB + 3])
    with pytest.raises(InvalidDistribution, match="not among"):
        SHIPPED.encode([9], [dist])
    plain = SparseDist(ids=np.array([5, 7]), weights=np.array([1000, 3]))
    assert not SHIPPED.encodable(plain)
    with pytest.raises(InvalidDistribution, match="grid"):
        SHIPPED.encode([5], [plain])


def test_the_shipped_drafts_q_round_trip_and_shrink(draft_dir, prompt_ids):
    """k = 4 blocks of the real draft's T = 0.8 q along held-out prompts (tokens sampled from
    the q itself): exact round trip, and the coded block is a fraction of the plain one."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(draft_dir)).eval()
    params, generator = SamplingParams(temperature=0.8), torch.Generator().manual_seed(0)
    coded = plain = blocks = 0
    for ids in prompt_ids[:6]:
        with torch.no_grad():
            probs = warp(model(torch.tensor([ids[-48:]])).logits[0], params)  # [48, vocab]
        for start in range(0, probs.shape[0] - 3, 4):
            q = [SHIPPED.quantize(row[:VOCAB], CAP) for row in probs[start:start + 4]]
            tokens = [d.sample(generator) for d in q]
            data = SHIPPED.encode(tokens, q)
            assert _same(SHIPPED.decode(data, tokens), q)
            draft = pb.Draft(tokens=tokens)
            for d in q:
                to_proto(d, draft.q.add())
            coded, plain, blocks = coded + len(data), plain + draft.ByteSize(), blocks + 1
    print(f"coded q {coded / blocks / 4:.1f} B per position; the same q as SparseDistributions "
          f"(with tokens) {plain / blocks / 4:.1f} B")
    assert coded < plain / 2


def test_the_link_codes_a_block_on_the_grid_and_sends_any_other_plain():
    """A session that negotiated the coded format still sends a block drafted for another one
    (plain-quantized before a re-open) as SparseDistributions; its own blocks go coded."""
    from edge.drafting import Block
    from edge.link.verifier_link import attach_q
    from tandem.codec import quantize
    probs = _dense([(3, 0.5), (9, 0.3), (11, 0.2)])
    for dist, coded in ((SHIPPED.quantize(probs), True), (quantize(probs), False)):
        draft = pb.Draft(tokens=[9])
        attach_q(draft, Block(tokens=[9], q=[dist]), SHIPPED)
        assert bool(draft.q_coded) == coded and len(draft.q) == (0 if coded else 1)
        back = SHIPPED.decode(draft.q_coded, [9])[0] if coded else dist
        assert back.ids.tolist() == dist.ids.tolist()
