"""Tiny random-weight decoders of other families than the shipped LLaMA one, built from
transformers' own config classes, as HF directories (config.json, model.safetensors, the
tokenizer's files) that the exporters, the draft runtimes and the verifier read like a
downloaded model; and greedy decoding on a draft runtime, to compare with transformers."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from gguf import GGUFReader
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig,
                          MistralConfig, Qwen2Config, Qwen3Config)

from edge.runtime.llama_runtime import LlamaDraftRuntime
from tandem.fingerprint import tokenizer_fingerprint

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_TOKENIZER = ROOT / "models" / "tokenizer"   # byte-level BPE, 4096 ids, <|endoftext|> = 0

CONFIGS = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
# Small enough to build, save and export in well under a second.
DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)


def copy_tokenizer(source: Path, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(source) / name, directory / name)


def build(family: str, directory: Path, *, seed: int = 0, tokenizer_dir: Path = SHIPPED_TOKENIZER,
          vocab_size: int = 4096, eos_id: int = 0, **overrides) -> Path:
    """A random-weight `family` model with the tokenizer of tokenizer_dir, saved to directory.

    The weights are drawn wider than transformers' default (std 0.02 leaves the logits nearly
    flat, where greedy ties would make a comparison test a coin toss)."""
    torch.manual_seed(seed)
    config = CONFIGS[family](**{**DIMS, "vocab_size": vocab_size, "bos_token_id": eos_id,
                                "eos_token_id": eos_id, "pad_token_id": eos_id,
                                "initializer_range": 0.2, "tie_word_embeddings": True, **overrides})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(directory)
    copy_tokenizer(tokenizer_dir, directory)
    return directory


@torch.no_grad()
def hf_greedy(model_dir: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy generate, eos stopping off."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    config = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=0,
                              eos_token_id=None, pad_token_id=0)
    return model.generate(torch.tensor([prompt]), generation_config=config)[0, len(prompt):].tolist()


def runtime_greedy(runtime, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding on a draft runtime (extend one token at a time, as drafting does)."""
    runtime.rollback(0)
    logits = runtime.extend(prompt)[-1]
    out = []
    for _ in range(new_tokens):
        out.append(int(logits.argmax()))
        logits = runtime.extend([out[-1]])[-1]
    return out


PROMPT = [17, 905, 33, 2048, 7, 311, 64, 1200]
NEW_TOKENS = 24


def check_gguf_equals_hf(hf_dir, gguf_path, arch: str) -> None:
    """The GGUF's logits are the HF model's (f32: ~1e-6), its greedy tokens too, and its
    fingerprint is the one the verifier computes for the HF tokenizer."""
    assert GGUFReader(gguf_path).fields["general.architecture"].contents() == arch
    runtime = LlamaDraftRuntime(gguf_path, n_ctx=128)
    try:
        with torch.no_grad():
            hf_logits = AutoModelForCausalLM.from_pretrained(hf_dir).eval()(torch.tensor([PROMPT])).logits[0]
        assert (runtime.extend(PROMPT) - hf_logits).abs().max() < 1e-3
        assert runtime_greedy(runtime, PROMPT, NEW_TOKENS) == hf_greedy(hf_dir, PROMPT, NEW_TOKENS)
        assert runtime.fingerprint() == tokenizer_fingerprint(AutoTokenizer.from_pretrained(hf_dir))
    finally:
        runtime.close()
