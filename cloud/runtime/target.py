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
import json
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cloud.runtime import slot_attention
from cloud.runtime.exact_path import ExactState, exact_forward
from cloud.runtime.kv import KVPool, KVState
from cloud.runtime.serving_path import (AUTO, EXACT, PATHS, SLOTS, SelfTest, ServingPath,
                                        UnsupportedTarget, length_dependent_rope,
                                        run_self_test, self_test_lengths)
from cloud.runtime.slot_attention import SlotBatch
from cloud.token_cost import PassModel
from tandem.fingerprint import tokenizer_fingerprint

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PAD_TOKEN = 0  # any valid id: what the warm-up and the position probe feed
# The position-cost probe (TargetRuntime.position_ms): a modest batch at a short context, where
# a pass's extra positions show above its fixed part, timed a few times (medians).
POSITION_PROBE_SESSIONS = 8
POSITION_PROBE_CONTEXT = 64
POSITION_PROBE_K = 8
POSITION_PROBE_REPS = 7


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
    """A local HF causal-LM directory loaded for verification, served by the slot pool when
    its self-test passes, else by the exact path (serving_path.py says which and why).

    Not thread-safe: one thread (the batcher's worker) runs every forward pass.
    """

    def __init__(self, model_dir: Path | str, device: str = "auto", dtype: str = "float32",
                 name: str | None = None, serving_path: str = AUTO) -> None:
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{self.model_dir}: not an HF model directory (no config.json)")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        if serving_path not in PATHS:
            raise ValueError(f"serving_path must be one of {PATHS}, got {serving_path!r}")
        started = time.perf_counter()
        self.device = resolve_device(device)
        self.dtype = dtype
        self.model, self.family = _load_model(self.model_dir, DTYPES[dtype], self.device)
        self.reference_attention = self.model.config._attn_implementation
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        self.name = name or self.model_dir.name  # what Info reports and Open.model must match
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.max_context = model_context_limit(self.model.config, tokenizer)
        self.pool = KVPool(self.device, max_capacity=self.max_context)
        self.forward_passes = 0  # passes run so far (tests use it to see "no compute")
        self.path = self._choose_path(serving_path)
        self.bytes_per_token = self._measure_bytes_per_token()
        log.info("target %s (%s) loaded from %s on %s (%s) in %.1f s: vocab %d, max context %d, "
                 "%d KV bytes per token, served by the %s path (%s)", self.name, self.family,
                 self.model_dir, self.device, dtype, time.perf_counter() - started,
                 self.vocab_size, self.max_context, self.bytes_per_token, self.path.name,
                 self.path.reason)

    def new_state(self) -> KVState | ExactState:
        if self.path.name == EXACT:
            return ExactState(self.bytes_per_token)
        return KVState(self.pool)

    def score(self, state: KVState | ExactState, tokens: Sequence[int]) -> torch.Tensor:
        """One session alone: append tokens, return float32 CPU logits [len(tokens), vocab]."""
        return self.forward([(state, tokens)])[0].cpu()

    def forward(self, batch: Sequence[tuple[KVState | ExactState, Sequence[int]]]) -> PassLogits:
        """One forward pass over many sessions: batch[i] = (state_i, new_tokens_i).

        Appends each session's new tokens to its cache and returns, per session, float32
        logits [len(new_tokens_i), vocab] on the runtime's device where row j is the
        next-token distribution after new_tokens_i[j]. On the exact path each session is a
        pass of its own.
        """
        assert batch, "empty batch"
        assert min(len(tokens) for _, tokens in batch) > 0, \
            "every session needs at least one new token"
        if self.path.name == EXACT:
            rows = exact_forward(self.model, self.device, batch)
            self.forward_passes += len(batch)
        else:
            rows = self._slot_forward(batch)
            self.forward_passes += 1
        lengths = [len(tokens) for _, tokens in batch]
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        return PassLogits(flat=torch.cat(rows), starts=starts, lengths=lengths)

    @torch.inference_mode()
    def _slot_forward(self, batch: Sequence[tuple[KVState, Sequence[int]]]) -> list[torch.Tensor]:
        """One packed pass through the slot attention; per session its rows (in batch order)."""
        slots = [state.bind() for state, _ in batch]
        assert len(set(slots)) == len(slots), "a session twice in one pass"
        order = sorted(range(len(batch)), key=slots.__getitem__)  # consecutive slots: a view
        states = [batch[i][0] for i in order]
        past = [state.length for state in states]
        new = [len(batch[i][1]) for i in order]
        self.pool.reserve(max(p + n for p, n in zip(past, new)))
        input_ids = torch.as_tensor([t for i in order for t in batch[i][1]],
                                    dtype=torch.long)[None]                       # [1, T]
        position_ids = torch.cat([torch.arange(p, p + n) for p, n in zip(past, new)])[None]
        slot_batch = SlotBatch.build(self.pool, [slots[i] for i in order], past, new,
                                     self.device)
        with slot_attention.slot_pass(slot_batch):
            # A 2-D mask of ones: the model builds its per-layer-type masks through our mask
            # interface (no packed-sequence guess from the restarting position ids).
            out = self.model(input_ids=input_ids.to(self.device),
                             position_ids=position_ids.to(self.device),
                             attention_mask=torch.ones_like(input_ids, device=self.device),
                             use_cache=False)
        for state, n in zip(states, new):
            state.length += n
        logits = out.logits[0].float()                                             # [T, vocab]
        rows: list[torch.Tensor] = [logits] * len(batch)
        offset = 0
        for i, n in zip(order, new):
            rows[i] = logits[offset: offset + n]
            offset += n
        return rows

    def _choose_path(self, requested: str) -> ServingPath:
        """The slot pool when its self-test passes (or EXACT when asked); else the exact path.
        A failing forced slot pool, or a model whose own forward fails, refuses to load."""
        try:
            self.reference_logits([PAD_TOKEN])
        except Exception as error:  # noqa: BLE001 - any family's failure, one line
            raise UnsupportedTarget(self.family, f"its own forward fails ({_one_line(error)})") \
                from error
        if requested == EXACT:
            return ServingPath(EXACT, "model.serving_path: exact", None)
        test = self._test_slots()
        if test.passed:
            return ServingPath(SLOTS, f"self-test passed: max logit diff {test.max_logit_diff:.2g}"
                               f" over {test.rows} rows", test)
        reason = "slot pool " + (f"cannot run it ({test.error})" if test.error else
                                 f"self-test failed: max logit diff {test.max_logit_diff:.3g} > "
                                 f"{test.tolerance:.3g}, argmax agreement "
                                 f"{test.argmax_agreement:.3f}")
        if requested == SLOTS:
            raise UnsupportedTarget(self.family, reason)
        if self.model.config._attn_implementation != self.reference_attention:
            self.model.set_attn_implementation(self.reference_attention)
        return ServingPath(EXACT, reason, test)

    def _test_slots(self) -> SelfTest:
        lengths = self_test_lengths(self.model.config, self.max_context)
        rope = length_dependent_rope(self.model.config)
        if rope:
            return SelfTest.not_run(lengths, f"rope type {rope!r} changes with the pass's "
                                             "longest position")
        outside = SelfTest.not_run(lengths, "its attention does not go through "
                                            "AttentionInterface")
        if not self.model._can_set_attn_implementation():  # transformers' own test of it
            return outside
        try:
            self.model.set_attn_implementation(slot_attention.register())
        except Exception as error:  # noqa: BLE001 - reported by name
            return SelfTest.not_run(lengths, _one_line(error))
        if self.model.config._attn_implementation != slot_attention.NAME:
            return outside
        test = run_self_test(lambda: KVState(self.pool), self._slot_forward,
                             self.reference_logits, self.vocab_size, lengths,
                             DTYPES[self.dtype])
        self.forward_passes = 0  # not the verifier's work
        return test

    @torch.inference_mode()
    def reference_logits(self, tokens: list[int]) -> torch.Tensor:
        """The model's own full forward with its own attention: [len(tokens), vocab] float32."""
        current = self.model.config._attn_implementation
        if current != self.reference_attention:
            self.model.set_attn_implementation(self.reference_attention)
        try:
            ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
            return self.model(input_ids=ids, use_cache=False).logits[0].float()
        finally:
            if current != self.reference_attention:
                self.model.set_attn_implementation(current)

    def rollback(self, state: KVState, length: int) -> None:
        state.rollback(length)

    @property
    def position_ms(self) -> float:
        """What one more fed position adds to a batched pass, ms (cloud/pass_cost.py)."""
        return self.pass_model.position_ms

    @functools.cached_property
    def pass_model(self) -> PassModel:
        """What a pass costs by its parts (cloud/token_cost.py), measured on first use (the
        verifier's start), once: passes of POSITION_PROBE_SESSIONS sessions at
        POSITION_PROBE_CONTEXT positions feeding 1 and 1 + POSITION_PROBE_K tokens each (c:
        the medians' difference per extra position), one of them feeding 1 (F: a pass's cost
        less one session's share, S * T(1) - T(S) over S - 1), and the S one-token rows with a
        block of 1 + POSITION_PROBE_K or of 3 beside them (cb: their difference per position;
        Fb: what the block of 3 adds less a job's step, (T(S) - F) / S, and 2 cb). ~0.4 s for
        the shipped target on a CPU core.
        The exact path (every session a pass of its own, nothing shared) measures c alone."""
        # The exact path runs each session alone: one session shows its position cost.
        sessions = 1 if self.path.name == EXACT else POSITION_PROBE_SESSIONS
        wide, short = [PAD_TOKEN] * (1 + POSITION_PROBE_K), [PAD_TOKEN] * 3
        shapes = {"narrow": [[PAD_TOKEN]] * sessions, "wide": [wide] * sessions}
        if sessions > 1:
            shapes.update(one=[[PAD_TOKEN]], beside_wide=[[PAD_TOKEN]] * sessions + [wide],
                          beside_short=[[PAD_TOKEN]] * sessions + [short])
        ms = self._time_passes(shapes, max(len(feeds) for feeds in shapes.values()))
        narrow = ms["narrow"]
        position_ms = max(ms["wide"] - narrow, 0.0) / (sessions * POSITION_PROBE_K)
        if sessions == 1:
            return PassModel(position_ms)
        fixed_ms = min(max((sessions * ms["one"] - narrow) / (sessions - 1), 0.0), ms["one"])
        block_position_ms = max(ms["beside_wide"] - ms["beside_short"], 0.0) / \
            (POSITION_PROBE_K + 1 - 3)
        step = max(narrow - fixed_ms, 0.0) / sessions  # one more job at one position
        block_fixed_ms = max(ms["beside_short"] - narrow - step - 2 * block_position_ms, 0.0)
        return PassModel(position_ms, fixed_ms, block_fixed_ms, block_position_ms, step)

    def _time_passes(self, shapes: dict[str, list[list[int]]], count: int) -> dict[str, float]:
        """Median ms of passes of each shape (a list of the tokens each session feeds) over
        `count` sessions of POSITION_PROBE_CONTEXT positions, interleaved, POSITION_PROBE_REPS
        times; not counted as the verifier's passes."""
        states = [self.new_state() for _ in range(count)]
        passes = self.forward_passes
        try:
            self.forward([(state, [PAD_TOKEN] * POSITION_PROBE_CONTEXT) for state in states])
            times: dict[str, list[float]] = {name: [] for name in shapes}
            for _ in range(POSITION_PROBE_REPS):
                for name, feeds in shapes.items():
                    started = time.perf_counter()
                    self.forward(list(zip(states, feeds)))
                    times[name].append(time.perf_counter() - started)
                    for state in states[:len(feeds)]:
                        state.rollback(POSITION_PROBE_CONTEXT)
        finally:
            for state in states:
                state.release()
            self.forward_passes = passes  # not the verifier's work
        return {name: statistics.median(seen) * 1000.0 for name, seen in times.items()}

    def _measure_bytes_per_token(self) -> int:
        """K/V bytes one position costs, measured with a one-token pass (also a warm-up): the
        slot pool's growth, or on the exact path the model's own cache."""
        if self.path.name == EXACT:
            with torch.inference_mode():
                ids = torch.tensor([[PAD_TOKEN]], device=self.device)
                out = self.model(input_ids=ids, use_cache=True)
            # A model without a per-position cache (recurrent state): its hidden states.
            config = self.model.config.get_text_config()
            hidden = getattr(config, "hidden_size", 0) * getattr(config, "num_hidden_layers", 1)
            return _cache_bytes(getattr(out, "past_key_values", None)) or \
                max(1, 2 * hidden * DTYPES[self.dtype].itemsize)
        state = self.new_state()
        self.score(state, [PAD_TOKEN])
        self.forward_passes = 0
        nbytes = state.nbytes
        state.release()
        return nbytes


def _load_model(model_dir: Path, dtype: torch.dtype,
                device: torch.device) -> tuple[torch.nn.Module, str]:
    """The model with its own default attention, and its family (config model_type); any
    failure to load as a causal LM is one UnsupportedTarget line."""
    try:
        family = str(json.loads((model_dir / "config.json").read_text()).get("model_type", "?"))
    except (OSError, ValueError) as error:
        raise UnsupportedTarget("?", f"config.json unreadable ({_one_line(error)})") from error
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, local_files_only=True)
    except Exception as error:  # noqa: BLE001 - KeyError, ValueError, shape errors: one line
        raise UnsupportedTarget(family, f"it does not load as a causal LM "
                                        f"({_one_line(error)})") from error
    return model.to(device).eval(), family


def _cache_bytes(cache) -> int:
    """Bytes of every tensor a one-position cache holds (its layers' keys, values, states)."""
    tensors = [value for layer in getattr(cache, "layers", []) for value in vars(layer).values()
               if isinstance(value, torch.Tensor)]
    return sum(t.nbytes for t in tensors)


def _one_line(error: BaseException) -> str:
    """The error's type and its first sentence: what a one-line refusal quotes."""
    text = str(error).strip().splitlines()
    if not text:
        return type(error).__name__
    return f"{type(error).__name__}: {text[0].split('. ')[0][:240]}"


def model_context_limit(config, tokenizer) -> int:
    text_config = config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    # Tokenizers without a real limit report a huge sentinel; fall back to a modest default.
    limit = getattr(tokenizer, "model_max_length", 0)
    return limit if 0 < limit < 1_000_000 else 2048
