"""Tiny random-weight targets of the model families transformers ships, built from each
family's own config class at test size, with the shipped tokenizer (so the shipped draft can
speculate against them). Windows (sliding, chunked) are shorter than the tests' contexts, and
every family-specific attention feature is left on (Gemma-2's softcap, gpt-oss's sinks, ...).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

WINDOW = 32  # shorter than every context the conformance tests use (>= 60 tokens)
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 64, 4, 2, 16, 4
# Families the issue names (must be served exactly), then every further one built here.
NAMED = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gpt_neox", "gpt2", "olmo2")
FURTHER = ("gemma", "gemma3_text", "cohere", "cohere2", "starcoder2", "stablelm", "granite",
           "olmo", "olmo3", "phi", "mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "smollm3",
           "exaone4", "ministral", "helium", "glm", "llama4_text", "gpt_bigcode", "gptj",
           "codegen", "opt", "bloom", "falcon", "gpt_neo", "mpt", "mamba")
# Per family, beyond the common sizes: what turns its window on or keeps it small.
EXTRA: dict[str, dict] = {
    "mistral": {"sliding_window": WINDOW},
    "mixtral": {"sliding_window": WINDOW, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2},
    "qwen3": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 2},
    "phi3": {"sliding_window": WINDOW},
    "gemma2": {"sliding_window": WINDOW, "attn_logit_softcapping": 5.0,
               "final_logit_softcapping": 3.0},
    "gemma3_text": {"sliding_window": WINDOW},
    "cohere2": {"sliding_window": WINDOW},
    "starcoder2": {"sliding_window": WINDOW},
    "olmo3": {"sliding_window": WINDOW},
    "exaone4": {"sliding_window": WINDOW, "sliding_window_pattern": 2},
    "ministral": {"sliding_window": WINDOW},
    "smollm3": {"use_sliding_window": True, "sliding_window": WINDOW},
    "gpt_oss": {"sliding_window": WINDOW, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 32},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "llama4_text": {"attention_chunk_size": WINDOW, "num_local_experts": 2,
                    "intermediate_size_mlp": 128},
    "gpt_neo": {"window_size": WINDOW, "attention_types": [[["global", "local"], LAYERS // 2]],
                "attention_layers": ["global", "local"] * (LAYERS // 2)},
    "mamba": {"state_size": 8},
    "gptj": {"rotary_dim": HEAD_DIM},
    "codegen": {"rotary_dim": HEAD_DIM},
}
# Common size attributes under the names different families use.
SIZES = {
    ("hidden_size", "n_embd", "d_model", "word_embed_proj_dim"): HIDDEN,
    ("intermediate_size", "n_inner", "ffn_dim"): 2 * HIDDEN,
    ("num_hidden_layers", "n_layer", "num_layers"): LAYERS,
    ("num_attention_heads", "n_head", "num_heads"): HEADS,
    ("num_key_value_heads",): KV_HEADS,
    ("head_dim",): HEAD_DIM,
    ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"): 1024,
}


def family_config(family: str, vocab_size: int, head_dim: int = HEAD_DIM):
    config = AutoConfig.for_model(family)
    sizes = SIZES if head_dim == HEAD_DIM else {
        **SIZES, ("hidden_size", "n_embd", "d_model", "word_embed_proj_dim"): HEADS * head_dim,
        ("intermediate_size", "n_inner", "ffn_dim"): 2 * HEADS * head_dim, ("head_dim",): head_dim}
    for names, value in sizes.items():
        for name in names:
            if hasattr(config, name):
                _set(config, name, value)
    for name, value in EXTRA.get(family, {}).items():
        setattr(config, name, value)
    if getattr(config, "layer_types", None) is not None:
        # Windowed families alternate local and global layers; the others stay global.
        windowed = "sliding_window" in EXTRA.get(family, {})
        local = next((t for t in config.layer_types if t != "full_attention"),
                     "sliding_attention") if windowed else "full_attention"
        _set(config, "layer_types",
             [local if i % 2 == 0 else "full_attention" for i in range(LAYERS)])
    config.vocab_size = vocab_size
    config.tie_word_embeddings = getattr(config, "tie_word_embeddings", False)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if hasattr(config, name):
            setattr(config, name, 0)
    return config


def _set(config, name: str, value) -> None:
    """Set a size; derived ones (a read-only property, e.g. Falcon's head_dim) stay derived."""
    try:
        setattr(config, name, value)
    except AttributeError:
        pass


def build_family(family: str, tokenizer_dir: Path, out: Path, seed: int = 0,
                 head_dim: int = HEAD_DIM) -> Path:
    """Save a tiny random `family` target with the tokenizer at out/family (head_dim: what
    vLLM's CPU kernels need, 64, where the torch tests keep 16); returns the dir."""
    target = out / (family if head_dim == HEAD_DIM else f"{family}-hd{head_dim}")
    if (target / "config.json").is_file():
        return target
    from transformers import AutoTokenizer
    vocab_size = len(AutoTokenizer.from_pretrained(tokenizer_dir))
    torch.manual_seed(seed)
    config = family_config(family, vocab_size, head_dim)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init is near uniform; a wider spread gives greedy margins a real shape.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0, 0.2)
    model.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, target / name)
    return target
