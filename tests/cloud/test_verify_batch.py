"""The batched acceptance test (cloud/verify_batch.py) equals the single-block reference
(cloud/verify.py) exactly, row by row: ragged greedy blocks, ragged sampled blocks with
rejections, acceptances and bonus tokens, several warps in one pass, fast-mode offsets, and a
refused round that leaves the others' verdicts intact."""
from __future__ import annotations

import pytest
import torch

from cloud.errors import ZeroDraftProbability
from cloud.verify import RoundCheck, verify_round
from cloud.verify_batch import verify_greedy_batch, verify_rounds, verify_sampled_batch
from tandem.sampling import SamplingParams, warp

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

VOCAB = 64


def _block(rng: torch.Generator, k: int, offset: int, params: SamplingParams,
           sharp: float) -> tuple[RoundCheck, torch.Tensor]:
    """A check and its job's logits [offset + k + 1, VOCAB]; sharp logits make the draft
    (sampled from a tempered p) often right, so both accept and reject paths run."""
    logits = torch.randn((offset + k + 1, VOCAB), generator=rng) * sharp
    p = torch.softmax(logits[offset: offset + k] / 1.5, dim=-1).double()          # [k, VOCAB]
    draft = [int(torch.multinomial(row, 1, generator=rng)) for row in p]
    if params.greedy:
        return RoundCheck.make(draft, offset, params, None, None), logits
    return RoundCheck.make(draft, offset, params, p, rng), logits


@pytest.mark.parametrize("seed", range(5))
def test_batched_rounds_equal_the_reference_round_by_round(seed):
    rng = torch.Generator().manual_seed(seed)
    paramses = [SamplingParams(), SamplingParams(temperature=1.0),
                SamplingParams(temperature=0.7, top_k=20), SamplingParams(temperature=1.0,
                                                                            top_p=0.9)]
    checks, logits = [], []
    for i in range(40):
        params = paramses[i % len(paramses)]
        k = int(torch.randint(0, 7, (1,), generator=rng))
        offset = int(torch.randint(0, 3, (1,), generator=rng))
        check, rows = _block(rng, k, offset, params, sharp=float(1 + i % 5))
        checks.append(check)
        logits.append(rows)
    got = verify_rounds(checks, logits)
    want = [verify_round(check, rows) for check, rows in zip(checks, logits)]
    assert got == want
    assert {v.accepted for v in want} != {0}  # some acceptances happened


def test_greedy_batch_padding_is_ignored():
    drafts = torch.tensor([[1, 2, 3], [4, 9, 9], [7, 7, 7]])
    lengths = torch.tensor([3, 1, 0])
    target = torch.tensor([[1, 2, 5, 6], [4, 9, 9, 9], [8, 8, 8, 8]])
    accepted, bonus = verify_greedy_batch(drafts, lengths, target)
    assert accepted.tolist() == [2, 1, 0] and bonus.tolist() == [5, 9, 8]


def test_sampled_batch_refuses_zero_q():
    p = torch.full((1, 2, 4), 0.25, dtype=torch.float64)
    q = torch.tensor([[[0.0, 1.0, 0.0, 0.0]]], dtype=torch.float64)
    with pytest.raises(ZeroDraftProbability):
        verify_sampled_batch(torch.tensor([[0]]), torch.tensor([1]), q, p,
                             torch.zeros((1, 2), dtype=torch.float64))


def test_a_refused_round_does_not_spoil_the_others():
    rng = torch.Generator().manual_seed(7)
    params = SamplingParams(temperature=1.0)
    good, good_rows = _block(rng, 3, 0, params, sharp=2.0)
    bad_q = torch.zeros((2, VOCAB), dtype=torch.float64)
    bad_q[:, 5] = 1.0
    bad = RoundCheck.make([6, 5], 0, params, bad_q, rng)                 # q(6) = 0
    out = verify_rounds([good, bad, None], [good_rows, torch.randn(3, VOCAB),
                                            torch.randn(2, VOCAB)])
    assert out[0] == verify_round(good, good_rows)
    assert isinstance(out[1], ZeroDraftProbability) and out[2] is None


def test_warp_of_stacked_rows_equals_warp_of_each():
    rng = torch.Generator().manual_seed(3)
    rows = torch.randn((6, 5, VOCAB), generator=rng)
    for params in (SamplingParams(temperature=0.8, top_k=10), SamplingParams(temperature=1.2,
                                                                            top_p=0.8)):
        stacked = warp(rows, params)
        assert all(torch.equal(stacked[i], warp(rows[i], params)) for i in range(6))
