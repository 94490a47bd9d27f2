"""The exact law of a target's first sampled tokens and the chi-square of observed samples
against it: what the sampled losslessness tests share."""
from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from tandem.sampling import SamplingParams, warp


def joint_law(model, ids: list[int], params: SamplingParams, n: int) -> dict[tuple, float]:
    """Exact law of the target's first n sampled tokens (top_k keeps it small)."""
    law: dict[tuple, float] = {(): 1.0}
    with torch.no_grad():
        for _ in range(n):
            nxt: dict[tuple, float] = {}
            for prefix, prob in law.items():
                logits = model(torch.tensor([ids + list(prefix)])).logits[0, -1]
                p = warp(logits[None].double(), params)[0]
                for token in torch.nonzero(p > 0).flatten().tolist():
                    nxt[prefix + (token,)] = prob * float(p[token])
            law = nxt
    return law


def spread_prompt(model, prompts, params, samples: int) -> tuple[list[int], dict]:
    """The first prompt whose 3-token law is spread over several sequences."""
    for ids in prompts:
        law = joint_law(model, ids, params, 3)
        if sum(1 for p in law.values() if p * samples >= 5) >= 4:
            return ids, law
    raise AssertionError("no held-out prompt with a spread-out 3-token law")


def chi_square_pvalue(law: dict[tuple, float], counts: dict[tuple, int], samples: int) -> float:
    """Pearson's test of counts against law; sequences expected < 5 times pooled in one bin."""
    keys = sorted(law, key=law.get, reverse=True)
    expected = np.array([law[k] * samples for k in keys])
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    big = expected >= 5
    observed = np.append(observed[big], observed[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    if expected[-1] < 5:
        observed[-2] += observed[-1]
        expected[-2] += expected[-1]
        observed, expected = observed[:-1], expected[:-1]
    return float(stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)
