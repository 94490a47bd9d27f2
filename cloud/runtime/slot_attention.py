"""Attention over the KV pool's slots, plugged into any HF model through transformers'
AttentionInterface, so the model's own layers (projections, rotary or learned positions, MLPs)
run unchanged and only the attention reads and writes the pool.

One batched pass: B sessions, each with past_b positions in its slot and new_b new tokens, fed
packed as one row of T = sum_b new_b tokens (the model's projections, MLPs and head run on real
tokens only); L = max_b (past_b + new_b). Per layer the function
  1. writes the new keys/values of every token into its slot at past_b + j (in place),
  2. lays the queries out as [B, N] (N = max_b new_b; a scatter, or a view when every session
     feeds N), reads the B slots' first L positions (a view when the slots are consecutive,
     else one gather), and
  3. runs torch SDPA with a per-row mask: query j of row b sees positions <= past_b + j, and
     gathers the real queries' outputs back into the packed row.
Grouped-query heads are folded into the query length (q [B, kv_heads, G * N, D]), so keys are
never repeated. Padded query rows see a valid prefix (no NaN) and are dropped.

Called without a SlotBatch (a plain model(...) call, e.g. a test's reference forward) it is
transformers' own SDPA attention.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cloud.runtime.kv import KVPool

NAME = "tandem_slots"
_registered = False


@dataclass
class SlotBatch:
    pool: KVPool
    slots: torch.Tensor           # [B] int64, each row's slot
    rows: slice | None            # slots == range(rows.start, rows.stop): read a view
    write_slots: torch.Tensor     # [T] int64, slot of each new token (T = sum new_b), packed
    write_positions: torch.Tensor  # [T] int64, its position in the slot
    pad_index: torch.Tensor | None  # [T] int64, each token's place in the [B * N] layout;
                                    # None: every row feeds N (the layout is the packing)
    mask: torch.Tensor            # [B, 1, N, L] bool
    length: int                   # L
    _folded: dict[int, torch.Tensor] = field(default_factory=dict)

    def mask_for(self, groups: int) -> torch.Tensor:
        """The mask for queries folded as [B, kv_heads, groups * N, D]: [B, 1, groups * N, L]."""
        if groups not in self._folded:
            self._folded[groups] = self.mask.repeat(1, 1, groups, 1)
        return self._folded[groups]

    @classmethod
    def build(cls, pool: KVPool, slots: list[int], past: list[int], new: list[int],
              device: torch.device) -> SlotBatch:
        """past[b], new[b]: positions row b holds before the pass and tokens it feeds."""
        size, width = len(slots), max(new)
        length = max(p + n for p, n in zip(past, new))
        consecutive = slots == list(range(slots[0], slots[0] + size))
        dense = min(new) == width
        write_slots = torch.tensor([s for s, n in zip(slots, new) for _ in range(n)])
        write_positions = torch.tensor([p + j for p, n in zip(past, new) for j in range(n)])
        pad_index = None if dense else torch.tensor(
            [b * width + j for b, n in enumerate(new) for j in range(n)])
        # Query j of row b (a padded j acts as the row's last token) sees positions <= its own.
        last = torch.tensor(past)[:, None] + torch.minimum(
            torch.arange(width)[None, :], torch.tensor(new)[:, None] - 1)      # [B, N]
        mask = torch.arange(length)[None, None, :] <= last[:, :, None]        # [B, N, L]
        return cls(pool=pool, slots=torch.tensor(slots, device=device),
                   rows=slice(slots[0], slots[0] + size) if consecutive else None,
                   write_slots=write_slots.to(device), write_positions=write_positions.to(device),
                   pad_index=None if pad_index is None else pad_index.to(device),
                   mask=mask[:, None].to(device), length=length)


def slot_attention(module: torch.nn.Module,
                   query: torch.Tensor,   # [1, H, T, D], packed (with a SlotBatch)
                   key: torch.Tensor,     # [1, kv_heads, T, D], the new tokens only
                   value: torch.Tensor,   # [1, kv_heads, T, D]
                   attention_mask: torch.Tensor | None,
                   dropout: float = 0.0, scaling: float | None = None,
                   **kwargs) -> tuple[torch.Tensor, None]:
    """Returns the attention output [1, T, H, D] for the packed row (what transformers'
    attention functions return: [batch, length, heads, head_dim])."""
    batch: SlotBatch | None = kwargs.pop("tandem_batch", None)
    if batch is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    _, heads, tokens, head_dim = query.shape                                  # [1, H, T, D]
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    size, width = batch.mask.shape[0], batch.mask.shape[2]
    keys, values = batch.pool.layer(module.layer_idx, kv_heads, head_dim, key.dtype)
    for pooled, new in ((keys, key), (values, value)):
        pooled[batch.write_slots, :, batch.write_positions] = new[0].transpose(0, 1)  # [T, kv, D]
    if batch.rows is not None:
        keys = keys[batch.rows, :, : batch.length]                             # [B, kv, L, D]
        values = values[batch.rows, :, : batch.length]
    else:  # index_select of the narrowed pool: half the time of advanced indexing on a CPU
        keys = keys.narrow(2, 0, batch.length).index_select(0, batch.slots)
        values = values.narrow(2, 0, batch.length).index_select(0, batch.slots)
    packed = query[0].transpose(0, 1)                                          # [T, H, D]
    if batch.pad_index is None:
        laid = packed.reshape(size, width, heads, head_dim)
    else:
        laid = packed.new_zeros((size * width, heads, head_dim))
        laid[batch.pad_index] = packed
        laid = laid.view(size, width, heads, head_dim)                         # [B, N, H, D]
    folded = laid.permute(0, 2, 1, 3).reshape(size, kv_heads, groups * width, head_dim)
    out = F.scaled_dot_product_attention(folded, keys, values,
                                         attn_mask=batch.mask_for(groups), scale=scaling)
    out = out.reshape(size, heads, width, head_dim).transpose(1, 2)           # [B, N, H, D]
    out = out.reshape(size * width, heads, head_dim)
    if batch.pad_index is not None:
        out = out[batch.pad_index]                                             # [T, H, D]
    return out[None], None                                                     # [1, T, H, D]


def register() -> str:
    """Make NAME an attn_implementation transformers knows (attention and mask); idempotent."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        AttentionInterface.register(NAME, slot_attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _registered = True
    return NAME
