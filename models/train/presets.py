"""Named architectures of the shipped model family (LLaMA layout, one shared tokenizer)."""
from __future__ import annotations

from dataclasses import dataclass

from transformers import LlamaConfig


@dataclass(frozen=True)
class ModelPreset:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_positions: int = 1024

    def llama_config(self, vocab_size: int, eos_token_id: int) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            max_position_embeddings=self.max_positions,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            bos_token_id=eos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=eos_token_id,
            attention_bias=False,
            mlp_bias=False,
        )


PRESETS = {
    "target": ModelPreset("tandem-target", hidden_size=256, num_layers=8, num_heads=8,
                          num_kv_heads=4, intermediate_size=688),
    "draft": ModelPreset("tandem-draft", hidden_size=128, num_layers=4, num_heads=4,
                         num_kv_heads=4, intermediate_size=320),
    # The middle rung of the edge ladder (edge/control/entropy.py drafts with it where the text
    # is hard): the target's width with 3 of its 8 layers, so it starts from the target's own
    # weights (train.py --init-from / --init-layers) and is then distilled like the draft.
    "small": ModelPreset("tandem-small", hidden_size=256, num_layers=3, num_heads=8,
                         num_kv_heads=4, intermediate_size=688),
}

# Roles distilled from the target (everything but the target itself).
DISTILLED = tuple(role for role in PRESETS if role != "target")
