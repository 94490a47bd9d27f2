"""The target runtime: one HF-format causal LM in torch (CUDA when present), any number of
sessions' KV caches in one preallocated pool (kv.py), and one batched forward pass over
sessions of ragged lengths that reads and writes those caches in place.

The batched pass feeds every session's new tokens packed into one row [1, T] (T = the sum of
the sessions' new tokens, no padding), with position_ids continuing each session's own
positions; the model runs with the slot attention (slot_attention.py), which writes every new
key/value into the session's slot and attends over the slots with a per-session mask. Job i's
rows of the output are then what session i alone would get (up to float rounding). Packed, a
pass costs what its real tokens cost: blocks of 1 to 17 tokens in one pass no longer compute
the short ones padded to the longest (measured: an adaptive controller's passes, k 4-16, spent
~40% of their position compute on padding). The model's own modules do everything else, so
any HF causal LM whose attention goes through transformers' AttentionInterface works (Llama,
GPT-2, ...).
"""
from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cloud.runtime import slot_attention
from cloud.runtime.kv import KVPool, KVState
from cloud.runtime.slot_attention import SlotBatch
from tandem.fingerprint import tokenizer_fingerprint

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PAD_TOKEN = 0  # any valid id: what the warm-up and the position probe feed
# The position-cost probe (TargetRuntime.position_ms): a modest batch at a short context, where
# a pass's extra positions show above its fixed part, timed a few times (medians).
POSITION_PROBE_SESSIONS = 8
POSITION_PROBE_CONTEXT = 64
POSITION_PROBE_K = 8
POSITION_PROBE_REPS = 5


def resolve_device(device: str) -> torch.device:
    """"auto" -> cuda:0 when CUDA is available, else cpu; "cuda" means cuda:0."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} requested but CUDA is not available")
        resolved = torch.device("cuda", resolved.index or 0)
    return resolved


@dataclass(frozen=True)
class PassLogits(Sequence):
    """The logits of one batched pass: self[i] = job i's rows [n_i, vocab] (a view, float32, on
    the runtime's device). `flat` is the whole pass, every job's rows one after another, for
    consumers that work on all rows at once."""
    flat: torch.Tensor     # [T, vocab], job i's rows at starts[i] .. starts[i] + lengths[i]
    starts: list[int]
    lengths: list[int]     # n_i

    def __getitem__(self, i):  # type: ignore[override]
        return self.flat[self.starts[i]: self.starts[i] + self.lengths[i]]

    def __len__(self) -> int:
        return len(self.starts)


class TargetRuntime:
    """A local HF causal-LM directory loaded for verification.

    Not thread-safe: one thread (the batcher's worker) runs every forward pass.
    """

    def __init__(self, model_dir: Path | str, device: str = "auto", dtype: str = "float32",
                 name: str | None = None) -> None:
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{self.model_dir}: not an HF model directory (no config.json)")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        started = time.perf_counter()
        self.device = resolve_device(device)
        self.dtype = dtype
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_dir, dtype=DTYPES[dtype], local_files_only=True,
            attn_implementation=slot_attention.register()).to(self.device).eval()
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        self.name = name or self.model_dir.name  # what Info reports and Open.model must match
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.max_context = _max_context(self.model.config, tokenizer)
        self.pool = KVPool(self.device, max_capacity=self.max_context)
        self.forward_passes = 0  # batched passes run so far (tests use it to see "no compute")
        self.bytes_per_token = self._measure_bytes_per_token()
        log.info("target %s loaded from %s on %s (%s) in %.1f s: vocab %d, max context %d, "
                 "%d KV bytes per token", self.name, self.model_dir, self.device, dtype,
                 time.perf_counter() - started, self.vocab_size, self.max_context,
                 self.bytes_per_token)

    def new_state(self) -> KVState:
        return KVState(self.pool)

    def score(self, state: KVState, tokens: Sequence[int]) -> torch.Tensor:
        """One session alone: append tokens, return float32 CPU logits [len(tokens), vocab]."""
        return self.forward([(state, tokens)])[0].cpu()

    @torch.inference_mode()
    def forward(self, batch: Sequence[tuple[KVState, Sequence[int]]]) -> PassLogits:
        """One forward pass over many sessions: batch[i] = (state_i, new_tokens_i).

        Writes each session's new K/V into its slot and returns, per session, float32 logits
        [len(new_tokens_i), vocab] on the runtime's device where row j is the next-token
        distribution after new_tokens_i[j].
        """
        assert batch, "empty batch"
        new = [len(tokens) for _, tokens in batch]
        assert min(new) > 0, "every session needs at least one new token"
        slots = [state.bind() for state, _ in batch]
        assert len(set(slots)) == len(slots), "a session twice in one pass"
        order = sorted(range(len(batch)), key=slots.__getitem__)  # consecutive slots: a view
        states = [batch[i][0] for i in order]
        past = [state.length for state in states]
        new = [new[i] for i in order]
        self.pool.reserve(max(p + n for p, n in zip(past, new)))

        # Packed: row b's tokens at offsets[b] .. offsets[b] + new[b] of the one row.
        offsets = [0]
        for n in new:
            offsets.append(offsets[-1] + n)
        input_ids = torch.as_tensor([t for i in order for t in batch[i][1]],
                                    dtype=torch.long)[None]                       # [1, T]
        position_ids = torch.cat([torch.arange(p, p + n) for p, n in zip(past, new)])[None]
        slot_batch = SlotBatch.build(self.pool, [slots[i] for i in order], past, new,
                                     self.device)
        out = self.model(
            input_ids=input_ids.to(self.device), position_ids=position_ids.to(self.device),
            # A 4-D mask is taken as it is (no mask building); the slot attention uses its own.
            attention_mask=slot_batch.mask, use_cache=False, tandem_batch=slot_batch)
        self.forward_passes += 1
        for state, n in zip(states, new):
            state.length += n
        starts = [0] * len(batch)
        for row, i in enumerate(order):
            starts[i] = offsets[row]
        return PassLogits(flat=out.logits[0].float(), starts=starts,
                          lengths=[len(tokens) for _, tokens in batch])

    def rollback(self, state: KVState, length: int) -> None:
        state.rollback(length)

    @functools.cached_property
    def position_ms(self) -> float:
        """What one more fed position adds to a batched pass, ms (cloud/pass_cost.py): passes of
        POSITION_PROBE_SESSIONS sessions at POSITION_PROBE_CONTEXT positions feeding 1 and
        1 + POSITION_PROBE_K tokens each, the medians' difference per extra position. Measured
        on first use (the verifier's start), once; ~0.2 s for the shipped target on a CPU core."""
        states = [self.new_state() for _ in range(POSITION_PROBE_SESSIONS)]
        passes = self.forward_passes
        try:
            self.forward([(state, [PAD_TOKEN] * POSITION_PROBE_CONTEXT) for state in states])
            times: dict[int, list[float]] = {1: [], 1 + POSITION_PROBE_K: []}
            for _ in range(POSITION_PROBE_REPS):
                for width, seen in times.items():
                    started = time.perf_counter()
                    self.forward([(state, [PAD_TOKEN] * width) for state in states])
                    seen.append(time.perf_counter() - started)
                    for state in states:
                        state.rollback(POSITION_PROBE_CONTEXT)
        finally:
            for state in states:
                state.release()
            self.forward_passes = passes  # not the verifier's work
        wide, narrow = (statistics.median(times[w]) for w in (1 + POSITION_PROBE_K, 1))
        return max(wide - narrow, 0.0) * 1000.0 / (POSITION_PROBE_SESSIONS * POSITION_PROBE_K)

    def _measure_bytes_per_token(self) -> int:
        """K/V bytes one position costs, measured with a one-token pass (also a warm-up)."""
        state = self.new_state()
        self.score(state, [PAD_TOKEN])
        self.forward_passes = 0
        nbytes = state.nbytes
        state.release()
        return nbytes


def _max_context(config, tokenizer) -> int:
    text_config = config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    # Tokenizers without a real limit report a huge sentinel; fall back to a modest default.
    limit = getattr(tokenizer, "model_max_length", 0)
    return limit if 0 < limit < 1_000_000 else 2048
