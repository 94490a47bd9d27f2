"""Random-weight targets of named real shapes, so a device's pass cost can be read without
downloading weights: the configs below are the published architectures (layer count, widths,
heads, vocabulary), the weights are transformers' random initialisation, and the tokenizer is
the shipped one (only its fingerprint and length limit are read; the model's own vocabulary
keeps its real size, so the output head costs what it costs).

A pass's time depends on the shapes, not on the weights' values, so a random target's surface
is the real model's surface.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from tandem.config import REPO_ROOT

TOKENIZER = REPO_ROOT / "models/tandem-target"
# Enough positions for the surfaces' contexts; the pool grows only as far as a pass reaches.
MAX_POSITIONS = 8192

# name -> (transformers config class, its arguments). Llama 3.2 1B, Llama 3.1 8B, Qwen2.5 7B.
SHAPES: dict[str, tuple[str, dict]] = {
    "llama-1b": ("LlamaConfig", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-5)),
    "llama-8b": ("LlamaConfig", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
        tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5)),
    "qwen-7b": ("Qwen2Config", dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6,
        use_sliding_window=False)),
}


def shape_config(name: str, layers: int | None = None, vocab: int | None = None):
    """The transformers config of a named shape (layers, vocab: fewer layers or a smaller
    vocabulary, for a quick look; the surface is then not the real model's)."""
    import transformers

    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose from {sorted(SHAPES)}")
    cls_name, kwargs = SHAPES[name]
    kwargs = dict(kwargs, max_position_embeddings=MAX_POSITIONS, bos_token_id=0,
                  eos_token_id=0, pad_token_id=0)
    if layers:
        kwargs["num_hidden_layers"] = layers
    if vocab:
        kwargs["vocab_size"] = vocab
    return getattr(transformers, cls_name)(**kwargs)


def parameter_count(config) -> int:
    """Weights of a decoder of this config (embeddings, layers, norms, head), without building
    it: what the memory bound and the summary quote."""
    hidden, inter = config.hidden_size, config.intermediate_size
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention = hidden * head_dim * (heads + 2 * kv) + heads * head_dim * hidden
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    embed = config.vocab_size * hidden
    head = 0 if config.tie_word_embeddings else embed
    return embed + head + config.num_hidden_layers * per_layer + hidden


def write_random_model(name: str, dtype: str, device: str, layers: int | None = None,
                       vocab: int | None = None, parent: Path | None = None) -> Path:
    """A random-weight model of the named shape saved as an HF directory (safetensors and the
    shipped tokenizer) in a new temporary directory under `parent`; the caller removes it.
    Initialised on `device` (a GPU does it in seconds) in `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cloud.runtime.target import DTYPES, resolve_device

    config = shape_config(name, layers, vocab)
    out = Path(tempfile.mkdtemp(prefix=f"tandem-{name}-", dir=parent))
    torch.manual_seed(0)
    with torch.device(resolve_device(device)):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    model.save_pretrained(out)
    del model
    AutoTokenizer.from_pretrained(TOKENIZER).save_pretrained(out)
    return out
