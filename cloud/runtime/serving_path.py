"""Which path serves a target, decided at load by measuring, never by a list of families.

The slot pool (slot_attention.py) serves a model when a self-test says its batched, ragged,
packed passes give the model's own logits: a few seeded random contexts longer than the
model's widest attention window, prefilled together in one pass at different lengths, then
extended together by blocks of different k; every row compared with the model's own full
forward (its reference attention, what `generate` runs). Otherwise the exact path
(exact_path.py) serves it, and says why. `model.serving_path` in the config can force either;
a forced slot pool that fails the self-test refuses to load (UnsupportedTarget).
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

AUTO, SLOTS, EXACT = "auto", "slots", "exact"
PATHS = (AUTO, SLOTS, EXACT)
# Logits of the same positions in differently shaped passes differ by rounding alone (~1e-5
# in float32 on a CPU); a real attention error (a window or a cap ignored, a stale row) is
# orders above. Scaled by the logits' own size.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 4e-2, torch.float16: 1e-2}
SELF_TEST_SESSIONS = (0, 1, 2)       # contexts of different lengths (index into the offsets)
SELF_TEST_BLOCKS = (1, 4, 7)         # tokens each session feeds in the second pass
SELF_TEST_MARGIN = 24                # positions beyond the widest window
SELF_TEST_MAX_CONTEXT = 1024         # longer windows are trusted to the family's mask rule


class UnsupportedTarget(RuntimeError):
    """A backend cannot serve this model exactly; one line naming the family and the reason,
    pointing to the other backend."""

    def __init__(self, family: str, reason: str, backend: str = "torch") -> None:
        hint = "try model.backend: vllm" if backend == "torch" else \
            "try model.backend: torch (tandem-cloud check MODEL_DIR)"
        super().__init__(f"model family {family!r} cannot be served exactly by the {backend} "
                         f"backend: {reason}; {hint}")
        self.family, self.reason = family, reason


@dataclass(frozen=True)
class SelfTest:
    contexts: list[int]         # each session's context length at the end of the test
    rows: int                   # logit rows compared
    max_logit_diff: float
    tolerance: float
    argmax_agreement: float     # share of rows whose argmax equals the reference's
    error: str = ""             # the slot pass raised (then nothing was compared)
    # Rows whose argmax differs although the reference's own choice leads by more than the
    # tolerance (a near-tie within rounding may flip in bfloat16; a real error is decisive).
    decisive_disagreements: int = 0

    @property
    def passed(self) -> bool:
        return not self.error and self.max_logit_diff <= self.tolerance \
            and self.decisive_disagreements == 0

    @classmethod
    def not_run(cls, contexts: Sequence[int], error: str) -> SelfTest:
        """The slot pass could not run (nothing was compared): why, in one line."""
        return cls(contexts=list(contexts), rows=0, max_logit_diff=float("inf"), tolerance=0.0,
                   argmax_agreement=0.0, error=error)


@dataclass(frozen=True)
class ServingPath:
    name: str                   # SLOTS or EXACT
    reason: str                 # why this path, in words
    self_test: SelfTest | None  # the slot pool's, when it was tried


def widest_window(config) -> int:
    """The largest local-attention span the config names (sliding window, chunk), 0 if none."""
    config = config.get_text_config()
    spans = [getattr(config, name, None) for name in
             ("sliding_window", "attention_chunk_size", "local_attention", "window_size")]
    return max([s for s in spans if isinstance(s, int) and s > 0], default=0)


def length_dependent_rope(config) -> str | None:
    """The rope type when the model's rotary frequencies depend on the pass's longest position
    (transformers' dynamic NTK and longrope pick them from max(position_ids) + 1): in a batched
    pass a short session would take a long one's frequencies, and a self-test within the
    original context length would not see it. Such models take the exact path."""
    config = config.get_text_config()
    for parameters in (getattr(config, "rope_parameters", None),
                       getattr(config, "rope_scaling", None)):
        if not isinstance(parameters, dict):
            continue
        # One dict, or one per layer type (sliding/full layers with their own rope).
        for entry in [parameters, *[v for v in parameters.values() if isinstance(v, dict)]]:
            rope_type = str(entry.get("rope_type") or entry.get("type") or "")
            if "dynamic" in rope_type or rope_type == "longrope":
                return rope_type
    return None


def self_test_lengths(config, max_context: int) -> list[int]:
    """Context lengths for the self-test: past the widest window, capped."""
    longest = min(max(widest_window(config), 32) + SELF_TEST_MARGIN, SELF_TEST_MAX_CONTEXT,
                  max_context - max(SELF_TEST_BLOCKS))
    return [max(2, longest - offset) for offset in (0, longest // 3, 2 * longest // 3)]


def run_self_test(new_state: Callable, forward: Callable,
                  reference: Callable[[list[int]], torch.Tensor], vocab_size: int,
                  lengths: Sequence[int], dtype: torch.dtype, seed: int = 0) -> SelfTest:
    """forward(batch) -> per-session logits (the path under test); reference(tokens) -> the
    model's own [len(tokens), vocab] logits. Two passes: a ragged prefill of every context,
    then ragged blocks; each row compared with the reference at the same position."""
    rng = random.Random(seed)
    contexts = [[rng.randrange(vocab_size) for _ in range(n)] for n in lengths]
    blocks = [[rng.randrange(vocab_size) for _ in range(k)] for k in SELF_TEST_BLOCKS]
    states = [new_state() for _ in contexts]
    try:
        first = forward(list(zip(states, contexts)))
        second = forward(list(zip(states, blocks)))
    except Exception as error:  # noqa: BLE001 - whatever the family raised, reported by name
        return SelfTest.not_run(lengths, f"{type(error).__name__}: "
                                         f"{str(error).splitlines()[0][:200]}")
    finally:
        for state in states:
            state.release()
    pairs = [(reference(context + block).float().cpu(),                     # [n + k, vocab]
              torch.cat([head.float().cpu(), tail.float().cpu()]))
             for context, block, head, tail in zip(contexts, blocks, first, second)]
    want, got = (torch.cat(side) for side in zip(*pairs))
    tolerance = TOLERANCE.get(dtype, 1e-2) * max(1.0, float(want.abs().max()))
    chosen, theirs = want.argmax(-1), got.argmax(-1)
    lead = want.gather(-1, chosen[:, None]) - want.gather(-1, theirs[:, None])  # [rows, 1]
    return SelfTest(contexts=[n + k for n, k in zip(lengths, SELF_TEST_BLOCKS)],
                    rows=len(want), max_logit_diff=float((got - want).abs().max()),
                    tolerance=tolerance,
                    argmax_agreement=float((chosen == theirs).float().mean()),
                    decisive_disagreements=int((lead[:, 0] > tolerance).sum()))
