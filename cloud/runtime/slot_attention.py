"""Attention over the KV pool's slots, plugged into any HF model through transformers'
AttentionInterface, so the model's own layers (projections, rotary or learned positions, MLPs)
run unchanged and only the attention reads and writes the pool.

One batched pass: B sessions, each with past_b positions in its slot and new_b new tokens
(right-padded to N), L = max_b (past_b + new_b). Per layer the function
  1. writes the new keys/values of every real token into its slot at past_b + j (in place),
  2. reads the B slots' first L positions (a view when the slots are consecutive, else one
     gather), and
  3. runs torch SDPA with a per-row mask: query j of row b sees positions <= past_b + j.
Grouped-query heads are folded into the query length (q [B, kv_heads, G * N, D]), so keys are
never repeated. Padded query rows see a valid prefix (no NaN) and are dropped by the caller.

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
    write_slots: torch.Tensor     # [T] int64, slot of each real new token (T = sum new_b)
    write_positions: torch.Tensor  # [T] int64, its position in the slot
    write_index: torch.Tensor | None  # [T] int64 into the flattened [B * N]; None = all of them
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
        write_index = None if dense else torch.tensor(
            [b * width + j for b, n in enumerate(new) for j in range(n)])
        # Query j of row b (a padded j acts as the row's last token) sees positions <= its own.
        last = torch.tensor(past)[:, None] + torch.minimum(
            torch.arange(width)[None, :], torch.tensor(new)[:, None] - 1)      # [B, N]
        mask = torch.arange(length)[None, None, :] <= last[:, :, None]        # [B, N, L]
        return cls(pool=pool, slots=torch.tensor(slots, device=device),
                   rows=slice(slots[0], slots[0] + size) if consecutive else None,
                   write_slots=write_slots.to(device), write_positions=write_positions.to(device),
                   write_index=None if write_index is None else write_index.to(device),
                   mask=mask[:, None].to(device), length=length)


def slot_attention(module: torch.nn.Module,
                   query: torch.Tensor,   # [B, H, N, D]
                   key: torch.Tensor,     # [B, kv_heads, N, D], the new tokens only
                   value: torch.Tensor,   # [B, kv_heads, N, D]
                   attention_mask: torch.Tensor | None,
                   dropout: float = 0.0, scaling: float | None = None,
                   **kwargs) -> tuple[torch.Tensor, None]:
    """Returns the attention output [B, N, H, D] (what transformers' attention functions
    return)."""
    batch: SlotBatch | None = kwargs.pop("tandem_batch", None)
    if batch is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    size, heads, width, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    keys, values = batch.pool.layer(module.layer_idx, kv_heads, head_dim, key.dtype)
    for pooled, new in ((keys, key), (values, value)):
        flat = new.transpose(1, 2).reshape(size * width, kv_heads, head_dim)  # [B * N, kv, D]
        if batch.write_index is not None:
            flat = flat[batch.write_index]                                      # [T, kv, D]
        pooled[batch.write_slots, :, batch.write_positions] = flat
    if batch.rows is not None:
        keys = keys[batch.rows, :, : batch.length]                             # [B, kv, L, D]
        values = values[batch.rows, :, : batch.length]
    else:
        keys = keys[batch.slots, :, : batch.length]
        values = values[batch.slots, :, : batch.length]
    folded = query.reshape(size, kv_heads, groups * width, head_dim)          # [B, kv, G*N, D]
    out = F.scaled_dot_product_attention(folded, keys, values,
                                         attn_mask=batch.mask_for(groups), scale=scaling)
    return out.reshape(size, heads, width, head_dim).transpose(1, 2), None    # [B, N, H, D]


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
