"""What the exporters read from an HF directory of a LLaMA-like decoder (llama, mistral, qwen2,
qwen3: RMSNorm, SwiGLU, rope): the architecture numbers from config.json and the byte-level BPE
vocabulary from tokenizer.json."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer


class UnsupportedModel(ValueError):
    """An HF directory whose architecture or tokenizer the exporters cannot represent faithfully."""


@dataclass(frozen=True)
class LlamaShape:
    """The numbers of a LLaMA decoder that a runtime needs, read from config.json."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    model_type: str = "llama"


def _first_id(value) -> int | None:
    # eos_token_id may be a list in HF configs; llama.cpp takes one id.
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _check_full_attention(hf_dir: Path, cfg: dict) -> None:
    """Every layer attends to the whole context: the exporters write no sliding window."""
    window = cfg.get("sliding_window")
    if window is not None and cfg.get("use_sliding_window", True) \
            and window < cfg["max_position_embeddings"]:
        raise UnsupportedModel(f"{hf_dir}: sliding_window {window} is shorter than the context "
                               f"({cfg['max_position_embeddings']}); the exported graph attends "
                               "to every position")
    windowed = {t for t in cfg.get("layer_types") or () if t != "full_attention"}
    if windowed:
        raise UnsupportedModel(f"{hf_dir}: layer_types {sorted(windowed)}: only full attention is exported")


def read_llama_shape(hf_dir: Path, model_types: tuple[str, ...] = ("llama",)) -> LlamaShape:
    """The shape of a LLaMA-like decoder (RMSNorm, SwiGLU, rope) whose config.json model_type is
    one of model_types; UnsupportedModel, in one line, otherwise."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    if cfg.get("model_type") not in model_types:
        raise UnsupportedModel(f"{hf_dir}: model_type {cfg.get('model_type')!r}, expected one of "
                               f"{', '.join(model_types)}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"{hf_dir}: hidden_act {cfg['hidden_act']!r}, expected 'silu'")
    _check_full_attention(Path(hf_dir), cfg)
    rope = cfg.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        # Scaled rope variants need extra GGUF keys and ONNX inputs we do not write.
        raise UnsupportedModel(f"{hf_dir}: rope_type {rope_type!r} is not supported, only 'default'")
    # transformers 5 keeps theta under rope_parameters; older configs have it at the top level.
    rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    num_heads = cfg["num_attention_heads"]
    return LlamaShape(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
        max_positions=cfg["max_position_embeddings"],
        rope_theta=float(rope_theta),
        rms_norm_eps=float(cfg["rms_norm_eps"]),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=_first_id(cfg.get("bos_token_id")),
        eos_token_id=_first_id(cfg.get("eos_token_id")),
        pad_token_id=_first_id(cfg.get("pad_token_id")),
        model_type=cfg["model_type"],
    )


@dataclass(frozen=True)
class BpeVocab:
    """A byte-level BPE vocabulary in id order, as GGUF's tokenizer.ggml.* keys want it."""
    tokens: list[str]         # [vocab] token string of each id (byte-level alphabet, e.g. "Ġ")
    special: list[bool]       # [vocab] True for added special tokens (<|endoftext|>): CONTROL in GGUF
    added: list[bool]         # [vocab] True for any added token (special or not)
    padding: list[bool]       # [vocab] True for ids the config has but the tokenizer does not
    merges: list[str]         # "left right", in priority order
    adds_bos: bool            # whether the HF tokenizer prepends the bos token by itself
    pre: str = "gpt-2"        # llama.cpp's name for the pre-tokenizer (tokenizer.ggml.pre)


# The split regexes before ByteLevel(use_regex=False) of the byte-level tokenizers llama.cpp
# knows by name, as their tokenizer.json files write them (llama.cpp's own copies are the same
# expressions with the case-insensitive group spelt out).
_CONTRACTIONS = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
_TAIL = "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
SPLIT_PRE_TOKENIZERS = {
    _CONTRACTIONS + "\\p{N}" + _TAIL: "qwen2",           # Qwen2, Qwen2.5, Qwen3: single digits
    _CONTRACTIONS + "\\p{N}{1,3}" + _TAIL: "llama-bpe",  # Llama-3: digits in runs of up to 3
}


def llama_cpp_pre(pre: dict) -> str | None:
    """llama.cpp's pre-tokenizer name for a byte-level tokenizer.json pre_tokenizer, or None."""
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"  # ByteLevel with the GPT-2 regex ("default" splits digits differently)
    members = (pre.get("pretokenizers") or []) if pre.get("type") == "Sequence" else []
    if (len(members) == 2 and members[0].get("type") == "Split"
            and members[0].get("behavior") == "Isolated" and not members[0].get("invert")
            and members[1].get("type") == "ByteLevel" and not members[1].get("use_regex", True)):
        return SPLIT_PRE_TOKENIZERS.get((members[0].get("pattern") or {}).get("Regex"))
    return None


def read_bpe_vocab(hf_dir: Path, vocab_size: int, bos_token_id: int | None) -> BpeVocab:
    path = Path(hf_dir) / "tokenizer.json"
    raw = json.loads(path.read_text())
    model = raw["model"]
    if model.get("type") != "BPE":
        raise UnsupportedModel(f"{path}: tokenizer model {model.get('type')!r}, expected 'BPE'")
    pre = llama_cpp_pre(raw.get("pre_tokenizer") or {})
    if pre is None:
        raise UnsupportedModel(f"{path}: a pre-tokenizer llama.cpp has no name for (known: "
                               f"ByteLevel with the GPT-2 regex, Qwen2's and Llama-3's splits)")

    by_id: dict[int, str] = {idx: tok for tok, idx in model["vocab"].items()}
    added_ids, special_ids = set(), set()
    for added in raw.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        added_ids.add(added["id"])
        if added.get("special"):
            special_ids.add(added["id"])
    n_ids = max(by_id) + 1
    if n_ids > vocab_size:
        raise UnsupportedModel(f"{path}: {n_ids} token ids but config vocab_size is {vocab_size}")
    missing = [i for i in range(n_ids) if i not in by_id]
    if missing:
        raise UnsupportedModel(f"{path}: vocabulary has holes, e.g. id {missing[0]}")

    tokens = [by_id[i] for i in range(n_ids)]
    # The embedding may be wider than the tokenizer (rounded-up vocab): name the spare rows the
    # way llama.cpp's converter does, so they can never be produced by tokenization.
    tokens += [f"[PAD{i}]" for i in range(n_ids, vocab_size)]
    # merges are ["a", "b"] pairs in new tokenizer.json files and "a b" strings in old ones.
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    hf_tok = Tokenizer.from_file(str(path))
    with_special = hf_tok.encode("a", add_special_tokens=True).ids
    adds_bos = bos_token_id is not None and len(with_special) > 1 and with_special[0] == bos_token_id
    return BpeVocab(
        tokens=tokens,
        special=[i in special_ids for i in range(vocab_size)],
        added=[i in added_ids for i in range(vocab_size)],
        padding=[i >= n_ids for i in range(vocab_size)],
        merges=merges,
        adds_bos=adds_bos,
        pre=pre,
    )
