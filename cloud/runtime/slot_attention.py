"""Attention over the KV pool's slots, plugged into any HF model through transformers'
AttentionInterface (and its mask interface), so the model's own layers (projections, rotary or
learned positions, MLPs) run unchanged and only the attention reads and writes the pool.

One batched pass: B sessions, each with past_b positions in its slot and new_b new tokens, fed
packed as one row of T = sum_b new_b tokens (the model's projections, MLPs and head run on real
tokens only); L = max_b (past_b + new_b). Per layer the function
  1. writes the new keys/values of every token into its slot at past_b + j (in place),
  2. lays the queries out as [B, N] (N = max_b new_b; a scatter, or a view when every session
     feeds N), reads the B slots' first L positions (a view when the slots are consecutive,
     else one gather), and
  3. attends with a per-row mask: query j of row b at position past_b + j, keys at 0 .. L-1,
     allowed where THE LAYER'S OWN MASK FUNCTION says so. The model builds one mask per layer
     type (causal, sliding window, chunked, ...) through transformers' mask interface; ours
     (layer_mask) hands the attention that mask function instead of a tensor, and the attention
     evaluates it at each row's own positions. So every family's per-layer mask rule is the
     family's own code, never a copy of it here.
Grouped-query heads are folded into the query length (q [B, kv_heads, G * N, D]), so keys are
never repeated. Padded query rows act as their row's last token (no NaN) and are dropped.
A pass that mixes 1-token rows (cloud-run steps, k = 0 rounds) with drafted blocks attends in
two parts, the 1-token rows at N = 1 and the blocks at their own N: one layout would pad every
1-token row to the longest block (measured on one CPU core, shipped target, 300-token contexts:
26 one-token rows beside 5 blocks of 5-10 took 49 ms a pass as one layout, the two parts alone
24.7 + 20.1 ms with the pass's fixed cost twice).

What the layer passes beside q, k, v is honoured or refused, never dropped: `scaling`;
`softcap` (Gemma-2's tanh logit capping) and attention sinks (`s_aux` / `sinks`, gpt-oss) take
an explicit softmax; `sliding_window` is also applied on top of the mask (the same rule the
mask function carries). Any other argument with a value (a position bias, sparse indices, ...)
raises UnsupportedAttention: the runtime's load-time self-test catches it and serves the model
by its exact path instead (cloud/runtime/serving_path.py).

Outside a slot pass (a plain model(...) call, e.g. a test's reference forward) the layer runs
the family's own eager attention with transformers' eager mask.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cloud.runtime.kv import KVPool

NAME = "tandem_slots"
_registered = False
# Arguments a layer may pass that change nothing here: dropout is 0 in eval, causality and
# positions come from the mask function and the rows, the rest is bookkeeping of other paths.
NEUTRAL_ARGUMENTS = frozenset({
    "dropout", "is_causal", "position_ids", "cache_position", "output_attentions", "use_cache",
    "past_key_values", "past_key_value", "output_hidden_states", "return_dict", "layer_idx",
    "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "deterministic",
    "position_embeddings", "head_mask", "layer_type", "logits_to_keep",
})
SINK_ARGUMENTS = ("s_aux", "sinks")
_current: contextvars.ContextVar[SlotBatch | None] = contextvars.ContextVar(
    "tandem_slot_batch", default=None)


class UnsupportedAttention(RuntimeError):
    """A layer asked for something the slot attention does not implement; the message names
    it (e.g. "position_bias")."""


@dataclass(frozen=True)
class LayerMask:
    """What the mask interface returns during a slot pass: the layer type's mask function,
    (batch_idx, head_idx, q_idx, kv_idx) -> bool, evaluated by the attention per row."""
    function: Callable


@dataclass
class RowLayout:
    """Some rows of a pass laid out as [B, N] for one attention call."""
    slots: torch.Tensor           # [B] int64, each row's slot
    rows: slice | None            # slots == range(rows.start, rows.stop): read a view
    tokens: torch.Tensor | None   # [t] int64, these rows' tokens' places in the packed pass;
                                  # None: all of the pass's tokens, in order
    pad_index: torch.Tensor | None  # [t] int64, each token's place in the [B * N] layout;
                                    # None: every row feeds N (the layout is the packing)
    query_positions: torch.Tensor  # [B, N] int64, query j's position (a padded j: the last)
    length: int                   # L, the longest of these rows
    _masks: dict[tuple[int, int | None], torch.Tensor] = field(default_factory=dict)

    def mask_for(self, layer_mask: LayerMask | None, window: int | None,
                 groups: int) -> torch.Tensor:
        """[B, 1, groups * N, L] bool: the layer's mask at each row's positions (causal when the
        model gave none), within `window` when the layer passes one, keys past a row's own
        tokens never seen, repeated for queries folded as [B, kv_heads, groups * N, D]."""
        key = (id(layer_mask.function) if layer_mask else 0, window, groups)
        if key not in self._masks:
            q = self.query_positions[:, None, :, None]                        # [B, 1, N, 1]
            kv = torch.arange(self.length, device=q.device)[None, None, None, :]  # [1,1,1,L]
            allowed = kv <= q[:, :, -1:]           # a row's own positions only (stale tail)
            if layer_mask is None:
                allowed = allowed & (kv <= q)
            else:
                try:
                    chosen = layer_mask.function(torch.zeros_like(q), torch.zeros_like(q), q, kv)
                except Exception as error:  # noqa: BLE001 - any family's function, named below
                    raise UnsupportedAttention(
                        f"mask function {getattr(layer_mask.function, '__qualname__', '?')} "
                        f"cannot be evaluated per row ({type(error).__name__})") from error
                allowed = allowed & torch.as_tensor(chosen, device=q.device).bool()
            if window is not None:
                allowed = allowed & (kv > q - window)
            self._masks[key] = allowed.repeat(1, 1, groups, 1)
        return self._masks[key]

    @classmethod
    def build(cls, slots: list[int], past: list[int], new: list[int],
              tokens: list[int] | None, device: torch.device) -> RowLayout:
        """past[b], new[b]: positions row b holds before the pass and tokens it feeds;
        tokens: their places in the packed pass (None: the whole pass, in order)."""
        size, width = len(slots), max(new)
        consecutive = slots == list(range(slots[0], slots[0] + size))
        pad_index = None if min(new) == width else torch.tensor(
            [b * width + j for b, n in enumerate(new) for j in range(n)], device=device)
        query_positions = torch.tensor(past)[:, None] + torch.minimum(
            torch.arange(width)[None, :], torch.tensor(new)[:, None] - 1)      # [B, N]
        return cls(slots=torch.tensor(slots, device=device),
                   rows=slice(slots[0], slots[0] + size) if consecutive else None,
                   tokens=None if tokens is None else torch.tensor(tokens, device=device),
                   pad_index=pad_index, query_positions=query_positions.to(device),
                   length=max(p + n for p, n in zip(past, new)))


@dataclass
class SlotBatch:
    pool: KVPool
    write_slots: torch.Tensor     # [T] int64, slot of each new token (T = sum new_b), packed
    write_positions: torch.Tensor  # [T] int64, its position in the slot
    layouts: list[RowLayout]      # one per attention call: the 1-token rows, the blocks

    @classmethod
    def build(cls, pool: KVPool, slots: list[int], past: list[int], new: list[int],
              device: torch.device) -> SlotBatch:
        """past[b], new[b]: positions row b holds before the pass and tokens it feeds."""
        write_slots = torch.tensor([s for s, n in zip(slots, new) for _ in range(n)])
        write_positions = torch.tensor([p + j for p, n in zip(past, new) for j in range(n)])
        parts = [[b for b, n in enumerate(new) if n == 1], [b for b, n in enumerate(new) if n > 1]]
        if not all(parts):  # one kind of row: one layout, the packing itself
            layouts = [RowLayout.build(slots, past, new, None, device)]
        else:
            starts = [0, *itertools.accumulate(new)]  # each row's first token in the packing
            layouts = [RowLayout.build([slots[b] for b in part], [past[b] for b in part],
                                       [new[b] for b in part],
                                       [starts[b] + j for b in part for j in range(new[b])],
                                       device) for part in parts]
        return cls(pool=pool, write_slots=write_slots.to(device),
                   write_positions=write_positions.to(device), layouts=layouts)


@contextlib.contextmanager
def slot_pass(batch: SlotBatch) -> Iterator[None]:
    """Within: the model's mask building and attention work on `batch`'s slots."""
    token = _current.set(batch)
    try:
        yield
    finally:
        _current.reset(token)


def _features(kwargs: dict) -> tuple[float | None, torch.Tensor | None, int | None]:
    """(softcap, sinks, sliding_window) a layer passed; anything else with a value refuses."""
    softcap = kwargs.pop("softcap", None)
    sinks = next((kwargs.pop(name) for name in SINK_ARGUMENTS if kwargs.get(name) is not None),
                 None)
    window = kwargs.pop("sliding_window", None)
    unknown = sorted(name for name, value in kwargs.items()
                     if name not in NEUTRAL_ARGUMENTS and name not in SINK_ARGUMENTS
                     and value is not None and value is not False)
    if unknown:
        raise UnsupportedAttention(f"attention argument(s) {', '.join(unknown)}")
    return softcap, sinks, window


def _explicit_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                        mask: torch.Tensor, scaling: float, softcap: float | None,
                        sinks: torch.Tensor | None, groups: int) -> torch.Tensor:
    """softmax(mask(cap(q k^T * scaling)) [+ sink column]) v, as the families' eager code:
    query [B, kv, G*N, D], keys/values [B, kv, L, D], mask [B, 1, G*N, L], sinks [H]."""
    scores = torch.matmul(query, keys.transpose(-1, -2)) * scaling       # [B, kv, G*N, L]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:  # one learned logit per head that takes probability mass, dropped
        size, kv_heads, folded, _ = scores.shape
        column = sinks.reshape(kv_heads, groups, 1).expand(kv_heads, groups, folded // groups)
        column = column.reshape(1, kv_heads, folded, 1).expand(size, -1, -1, -1).to(scores.dtype)
        scores = torch.cat([scores, column], dim=-1)
        probs = F.softmax(scores - scores.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
    else:
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs.to(values.dtype), values)                  # [B, kv, G*N, D]


def slot_attention(module: torch.nn.Module,
                   query: torch.Tensor,   # [1, H, T, D], packed (in a slot pass)
                   key: torch.Tensor,     # [1, kv_heads, T, D], the new tokens only
                   value: torch.Tensor,   # [1, kv_heads, T, D]
                   attention_mask: LayerMask | torch.Tensor | None,
                   dropout: float = 0.0, scaling: float | None = None,
                   **kwargs) -> tuple[torch.Tensor, None]:
    """Returns the attention output [1, T, H, D] for the packed row (what transformers'
    attention functions return: [batch, length, heads, head_dim])."""
    batch = _current.get()
    if batch is None:
        return _family_eager(module)(module, query, key, value, attention_mask,
                                     dropout=dropout, scaling=scaling, **kwargs)
    if attention_mask is not None and not isinstance(attention_mask, LayerMask):
        raise UnsupportedAttention("a mask tensor built by the model itself")
    features = _features(dict(kwargs))
    kv_heads, head_dim, value_dim = key.shape[1], query.shape[-1], value.shape[-1]
    scaling = head_dim ** -0.5 if scaling is None else scaling
    keys, values = batch.pool.layer(module.layer_idx, kv_heads, (head_dim, value_dim), key.dtype)
    for pooled, new in ((keys, key), (values, value)):
        pooled[batch.write_slots, :, batch.write_positions] = new[0].transpose(0, 1)  # [T, kv, D]
    packed = query[0].transpose(0, 1)                                          # [T, H, D]
    if len(batch.layouts) == 1:
        out = _attend(batch.layouts[0], packed, keys, values, attention_mask, scaling, features)
    else:
        out = packed.new_empty((packed.shape[0], packed.shape[1], value_dim))
        for layout in batch.layouts:
            out[layout.tokens] = _attend(layout, packed[layout.tokens], keys, values,
                                         attention_mask, scaling, features)
    return out[None], None                                                     # [1, T, H, Dv]


def _attend(layout: RowLayout, packed: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
            attention_mask: LayerMask | None, scaling: float,
            features: tuple[float | None, torch.Tensor | None, int | None]) -> torch.Tensor:
    """One layout's rows: packed queries [t, H, D] against the pool's keys/values (every slot,
    [slots, kv, max, D]) -> [t, H, Dv]."""
    softcap, sinks, window = features
    heads, head_dim = packed.shape[1:]
    kv_heads, value_dim = keys.shape[1], values.shape[-1]
    groups = heads // kv_heads
    size, width = layout.query_positions.shape
    if layout.rows is not None:
        keys = keys[layout.rows, :, : layout.length]                           # [B, kv, L, D]
        values = values[layout.rows, :, : layout.length]
    else:  # index_select of the narrowed pool: half the time of advanced indexing on a CPU
        keys = keys.narrow(2, 0, layout.length).index_select(0, layout.slots)
        values = values.narrow(2, 0, layout.length).index_select(0, layout.slots)
    if layout.pad_index is None:
        laid = packed.reshape(size, width, heads, head_dim)
    else:
        laid = packed.new_zeros((size * width, heads, head_dim))
        laid[layout.pad_index] = packed
        laid = laid.view(size, width, heads, head_dim)                         # [B, N, H, D]
    folded = laid.permute(0, 2, 1, 3).reshape(size, kv_heads, groups * width, head_dim)
    mask = layout.mask_for(attention_mask, window, groups)
    if softcap is None and sinks is None:
        out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scaling)
    else:
        out = _explicit_attention(folded, keys, values, mask, scaling, softcap, sinks, groups)
    out = out.reshape(size, heads, width, value_dim).transpose(1, 2)          # [B, N, H, Dv]
    out = out.reshape(size * width, heads, value_dim)
    return out if layout.pad_index is None else out[layout.pad_index]         # [t, H, Dv]


def layer_mask(*, mask_function: Callable, **kwargs):
    """transformers' mask interface: in a slot pass, the layer type's mask function itself
    (the attention evaluates it per row); otherwise the eager mask the family's eager
    attention expects."""
    if _current.get() is not None:
        return LayerMask(mask_function)
    from transformers.masking_utils import eager_mask
    return eager_mask(mask_function=mask_function, **kwargs)


def _family_eager(module: torch.nn.Module) -> Callable:
    """The eager attention the module's own modeling file defines (softcap, sinks and all),
    else transformers' generic one."""
    own = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if own is not None:
        return own
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward


def register() -> str:
    """Make NAME an attn_implementation transformers knows (attention and mask); idempotent."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
        AttentionInterface.register(NAME, slot_attention)
        AttentionMaskInterface.register(NAME, layer_mask)
        _registered = True
    return NAME
