"""Drafting a block: the draft runtime's KV cache kept in step with the session's context, and
the choice of each draft token (greedy argmax, or a sample from the sparse quantized q).

The cache holds a prefix of what the runtime was fed; `DraftCursor.sync` rolls it back to the
longest prefix it shares with the new context and feeds the rest, so one method serves the
round's rollback (to the accepted prefix), re-opens and local decoding alike.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from edge.runtime.base import DraftRuntime
from tandem.codec import SparseDist, quantize
from tandem.qcodec import QCodec
from tandem.sampling import SamplingParams, warp


@dataclass
class Block:
    """The k draft tokens of one round and, when sampling, the q each was drawn from."""
    tokens: list[int] = field(default_factory=list)
    q: list[SparseDist] = field(default_factory=list)  # len(tokens) entries, or [] for greedy
    confidences: list[float] = field(default_factory=list)  # draft top prob per position
    entropies: list[float] = field(default_factory=list)    # draft entropy (nats) per position
    end_reason: str = "length"  # "length" | "confidence" | "stop_id" | "zero" (k = 0)
    draft_s: float = 0.0        # time spent drafting it (sync included)
    sync_s: float = 0.0         # of which: rolling the cache to the context and feeding it
    sync_tokens: int = 0        # tokens that sync fed (1 after a verdict: one decode step)

    def __len__(self) -> int:
        return len(self.tokens)

    def head(self, n: int, end_reason: str = "length") -> "Block":
        """The first n positions, the block ending for `end_reason` when cut (the draft cursor
        rolls back to the context on its next draft, as after a rejection)."""
        if n >= len(self.tokens):
            return self
        return replace(self, tokens=self.tokens[:n], q=self.q[:n], confidences=self.confidences[:n],
                       entropies=self.entropies[:n], end_reason=end_reason)

    def tail(self, start: int) -> "Block":
        """The block without its first `start` positions."""
        return replace(self, tokens=self.tokens[start:], q=self.q[start:],
                       confidences=self.confidences[start:], entropies=self.entropies[start:])


def draft_seed(seed: int) -> int:
    """The edge's RNG seed for a session seed.

    The verifier seeds its acceptance test from the same session seed; if the draft drew its
    tokens from an identical stream, the draft token and the acceptance uniform would be
    dependent and the output biased. Hashing the seed gives the edge its own stream.
    """
    digest = hashlib.sha256(f"tandem-draft:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class TokenChooser:
    """Picks a draft token from the draft's logits: greedy argmax, or a sample from exactly the
    quantized distribution q that is sent to the verifier (so acceptance uses the true q).

    `codec`: the coded-q format the session negotiated (tandem/qcodec.py); its quantizer makes
    the q then, so the q the token is drawn from is exactly what the verifier decodes. None:
    the plain quantizer (tandem.codec.quantize with q_scale)."""

    def __init__(self, params: SamplingParams, q_scale: int) -> None:
        self.params = params
        self.q_scale = q_scale
        self.codec: QCodec | None = None
        self.generator = torch.Generator().manual_seed(draft_seed(params.seed))

    def choose(self, logits: torch.Tensor, max_entries: int) -> tuple[int, SparseDist | None]:
        """logits: [vocab] -> (token id, q or None when greedy)."""
        assert logits.dim() == 1, f"expected [vocab] logits, got {tuple(logits.shape)}"
        if self.params.greedy:
            return int(logits.argmax()), None
        probs = warp(logits, self.params)
        q = (self.codec.quantize(probs, max_entries) if self.codec is not None
             else quantize(probs, max_entries=max_entries, scale=self.q_scale))
        return q.sample(self.generator), q


class DraftCursor:
    """A DraftRuntime plus the tokens its cache holds and the logits after the last of them."""

    def __init__(self, runtime: DraftRuntime) -> None:
        self.runtime = runtime
        self.tokens: list[int] = []            # what the runtime's KV cache holds, in order
        self.next_logits: torch.Tensor | None = None  # [vocab] after tokens[-1]

    def sync(self, context: Sequence[int]) -> int:
        """Make the cache hold exactly `context` (non-empty) and `next_logits` follow its end.
        Returns how many tokens it fed."""
        if not context:
            raise ValueError("the context must hold at least one token")
        if self.runtime.position != len(self.tokens):
            # Someone else fed or rolled back the runtime: its cache content is unknown.
            self.tokens = []
            self.runtime.rollback(0)
        common = _common_prefix(self.tokens, context)
        if common == len(context) == len(self.tokens):
            return 0
        # The logits after context[-1] come from feeding it, so at least that token is re-fed.
        keep = min(common, len(context) - 1)
        self.runtime.rollback(keep)
        logits = self.runtime.extend(list(context[keep:]))  # [len(context) - keep, vocab]
        assert logits.dim() == 2 and logits.shape[0] == len(context) - keep, tuple(logits.shape)
        self.tokens = list(context)
        self.next_logits = logits[-1]
        return len(context) - keep

    def draft(self, context: Sequence[int], k: int, chooser: TokenChooser, *, vocab_size: int,
              max_entries: int, stop_ids: frozenset[int] = frozenset(),
              min_confidence: float = 0.0) -> Block:
        """Draft up to k tokens after `context`; the block ends early at a stop id, or before a
        position whose top probability is below min_confidence (llama.cpp's draft-p-min; that
        token is not drafted, so the chooser's RNG is not touched).

        Only ids below vocab_size are drafted (a draft with a padded vocabulary must not propose
        ids the target does not have). Feeds k - 1 tokens: the last one needs no logits.
        """
        if k == 0:
            # Nothing to draft: leave the cache behind rather than feed it a token now (a
            # decode step on a slow device); the next draft catches up in one prefill.
            return Block(end_reason="zero")
        t0 = time.perf_counter()
        fed = self.sync(context)
        block = Block(sync_s=time.perf_counter() - t0, sync_tokens=fed)
        for i in range(k):
            logits = self.next_logits[:vocab_size]
            confidence, entropy = confidence_entropy(logits)
            if i > 0 and confidence < min_confidence:
                block.end_reason = "confidence"
                break
            token, q = chooser.choose(logits, max_entries)
            block.tokens.append(token)
            block.confidences.append(confidence)
            block.entropies.append(entropy)
            if q is not None:
                block.q.append(q)
            if token in stop_ids:
                block.end_reason = "stop_id"
                break
            if i == k - 1:
                break
            self.next_logits = self.runtime.extend([token])[-1]
            self.tokens.append(token)
        block.draft_s = time.perf_counter() - t0
        return block


def confidence_entropy(logits: torch.Tensor) -> tuple[float, float]:
    """[vocab] logits -> (top probability, entropy in nats) of the draft's own distribution."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    return float(p.max()), float(-(p * logp).nan_to_num().sum())


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
