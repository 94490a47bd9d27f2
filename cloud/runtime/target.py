"""The target runtime: one HF-format causal LM in torch (CUDA when present), any number of
per-session KV caches, and one batched forward pass over sessions of ragged lengths.

The batched pass packs the sessions into one padded batch: each session's past K/V is placed
right-aligned in a [batch, kv_heads, max_past, head_dim] cache (left padding), its new tokens
left-aligned in [batch, max_new] (right padding), a 2-D attention mask hides both kinds of
padding and explicit position_ids continue each session's own positions. Row i of the output
is then exactly what session i alone would get (up to float rounding). Any causal LM that takes
a Cache, attention_mask and position_ids works this way; nothing here is Llama-specific.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from cloud.runtime.kv import KVState
from tandem.fingerprint import tokenizer_fingerprint

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PAD_TOKEN = 0  # any valid id: padded positions are masked out and their outputs dropped


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
            self.model_dir, dtype=DTYPES[dtype], local_files_only=True).to(self.device).eval()
        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
        self.name = name or self.model_dir.name  # what Info reports and Open.model must match
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.max_context = _max_context(self.model.config, tokenizer)
        self.forward_passes = 0  # batched passes run so far (tests use it to see "no compute")
        self.bytes_per_token = self._measure_bytes_per_token()
        log.info("target %s loaded from %s on %s (%s) in %.1f s: vocab %d, max context %d, "
                 "%d KV bytes per token", self.name, self.model_dir, self.device, dtype,
                 time.perf_counter() - started, self.vocab_size, self.max_context,
                 self.bytes_per_token)

    def new_state(self) -> KVState:
        return KVState()

    def score(self, state: KVState, tokens: Sequence[int]) -> torch.Tensor:
        """One session alone: append tokens, return float32 logits [len(tokens), vocab]."""
        return self.forward([(state, tokens)])[0]

    @torch.inference_mode()
    def forward(self, batch: Sequence[tuple[KVState, Sequence[int]]]) -> list[torch.Tensor]:
        """One forward pass over many sessions: batch[i] = (state_i, new_tokens_i).

        Appends each session's new K/V to its state and returns, per session, float32 CPU
        logits [len(new_tokens_i), vocab] where row j is the next-token distribution after
        new_tokens_i[j].
        """
        assert batch, "empty batch"
        past = [state.length for state, _ in batch]
        new = [len(tokens) for _, tokens in batch]
        assert min(new) > 0, "every session needs at least one new token"
        size, max_past, max_new = len(batch), max(past), max(new)

        input_ids = torch.full((size, max_new), PAD_TOKEN, dtype=torch.long)         # [B, N]
        position_ids = torch.zeros((size, max_new), dtype=torch.long)                # [B, N]
        attention_mask = torch.zeros((size, max_past + max_new), dtype=torch.long)   # [B, P + N]
        for i, (state, tokens) in enumerate(batch):
            input_ids[i, : new[i]] = torch.as_tensor(list(tokens), dtype=torch.long)
            position_ids[i, : new[i]] = torch.arange(past[i], past[i] + new[i])
            attention_mask[i, max_past - past[i]: max_past + new[i]] = 1
        ragged = size > 1 and (min(past) != max_past or min(new) != max_new)

        out = self.model(
            input_ids=input_ids.to(self.device),
            position_ids=position_ids.to(self.device),
            # Without padding the mask is all ones; None lets the model take its causal fast path.
            attention_mask=attention_mask.to(self.device) if ragged else None,
            past_key_values=self._pack([state for state, _ in batch], max_past),
            use_cache=True)
        self.forward_passes += 1

        logits = out.logits.float()                                                   # [B, N, V]
        cache_layers = out.past_key_values.layers
        for i, (state, _) in enumerate(batch):
            state.append([(layer.keys[i, :, max_past: max_past + new[i]],
                           layer.values[i, :, max_past: max_past + new[i]])
                          for layer in cache_layers])
        return [logits[i, : new[i]].cpu() for i in range(size)]

    def rollback(self, state: KVState, length: int) -> None:
        state.rollback(length)

    def _pack(self, states: list[KVState], max_past: int) -> DynamicCache:
        """A padded batch cache: session i's K/V right-aligned in
        [B, kv_heads, max_past, head_dim]."""
        if max_past == 0:
            return DynamicCache()
        template = next(state for state in states if state.length)
        packed = []
        for layer, (keys, values) in enumerate(template.layers):
            batch_keys = keys.new_zeros((len(states), keys.shape[0], max_past, keys.shape[2]))
            batch_values = values.new_zeros((len(states), values.shape[0], max_past,
                                             values.shape[2]))
            for i, state in enumerate(states):
                if state.length:
                    state_keys, state_values = state.layers[layer]
                    batch_keys[i, :, max_past - state.length:] = state_keys
                    batch_values[i, :, max_past - state.length:] = state_values
            packed.append((batch_keys, batch_values))
        return DynamicCache(ddp_cache_data=packed)

    def _measure_bytes_per_token(self) -> int:
        """K/V bytes one position costs, measured with a one-token pass (also a warm-up)."""
        state = self.new_state()
        self.score(state, [PAD_TOKEN])
        self.forward_passes = 0
        return state.nbytes


def _max_context(config, tokenizer) -> int:
    text_config = config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    # Tokenizers without a real limit report a huge sentinel; fall back to a modest default.
    limit = getattr(tokenizer, "model_max_length", 0)
    return limit if 0 < limit < 1_000_000 else 2048
