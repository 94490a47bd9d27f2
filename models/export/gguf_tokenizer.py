"""The tokenizer.ggml.* keys of a GGUF, from an HF directory's tokenizer.json, by tokenizer kind
(tandem.fingerprint.tokenizer_json_kind):

  * byte-level BPE (the shipped tokenizer, Llama-3, Qwen): tokenizer model "gpt2" with the
    pre-tokenizer llama.cpp names for the tokenizer.json's ("gpt-2" = ByteLevel with the GPT-2
    regex, "qwen2", "llama-bpe"; hf_source.llama_cpp_pre), merges as "a b" strings, CONTROL type for special tokens so that
    <|endoftext|> is one id with tokenize(..., special=True). Written here, since llama.cpp's
    convert_hf_to_gguf.py refuses a newly trained BPE tokenizer ("BPE pre-tokenizer was not
    recognized");
  * SentencePiece-style with byte fallback (Llama-2, Mistral, Gemma): tokenizer model "llama",
    written by llama.cpp's own code for it, which the `gguf` package ships (LlamaHfVocab and
    SpecialVocab, as convert_hf_to_gguf.py's _set_vocab_llama_hf uses them).

Either way the token strings are the HF ones in id order, so the llama.cpp runtime's tokenizer
fingerprint equals the HF tokenizer's. The edge tokenizes with HF `tokenizers`, never with
llama.cpp, so only the strings and the special ids must be right.
"""
from __future__ import annotations

import json
from pathlib import Path

import gguf

from models.export.hf_source import BpeVocab, LlamaShape, UnsupportedModel, read_bpe_vocab
from tandem.fingerprint import BYTE_LEVEL, SENTENCEPIECE, tokenizer_json_kind


def _token_type(vocab: BpeVocab, idx: int) -> gguf.TokenType:
    if vocab.padding[idx]:
        return gguf.TokenType.UNUSED
    if vocab.special[idx]:
        return gguf.TokenType.CONTROL
    if vocab.added[idx]:
        return gguf.TokenType.USER_DEFINED
    return gguf.TokenType.NORMAL


def _write_byte_level(writer: gguf.GGUFWriter, shape: LlamaShape, vocab: BpeVocab) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types([_token_type(vocab, i) for i in range(len(vocab.tokens))])
    writer.add_token_merges(vocab.merges)
    if shape.bos_token_id is not None:
        writer.add_bos_token_id(shape.bos_token_id)
    if shape.eos_token_id is not None:
        writer.add_eos_token_id(shape.eos_token_id)
    if shape.pad_token_id is not None:
        writer.add_pad_token_id(shape.pad_token_id)
    # Match the HF tokenizer: ours adds no bos, so llama.cpp must not either.
    writer.add_add_bos_token(vocab.adds_bos)
    writer.add_add_eos_token(False)


def _write_sentencepiece(writer: gguf.GGUFWriter, shape: LlamaShape, hf_dir: Path) -> None:
    try:
        vocab = gguf.LlamaHfVocab(hf_dir)
    except (FileNotFoundError, TypeError) as err:  # how LlamaHfVocab says "not my kind"
        raise UnsupportedModel(f"{hf_dir}: SentencePiece-style tokenizer llama.cpp's "
                               f"LlamaHfVocab does not read: {err}") from None
    tokens, scores, types = [], [], []
    for text, score, token_type in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(token_type)
    if len(tokens) > shape.vocab_size:
        raise UnsupportedModel(f"{hf_dir}: {len(tokens)} tokens but config vocab_size is {shape.vocab_size}")
    for i in range(len(tokens), shape.vocab_size):  # spare embedding rows, never produced
        tokens.append(f"[PAD{i}]".encode())
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    gguf.SpecialVocab(hf_dir, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)


def write_tokenizer(writer: gguf.GGUFWriter, shape: LlamaShape, hf_dir: Path) -> None:
    """Write the directory's tokenizer; UnsupportedModel (one line) for a kind GGUF cannot hold."""
    path = Path(hf_dir) / "tokenizer.json"
    if not path.is_file():
        raise UnsupportedModel(f"{hf_dir}: no tokenizer.json")
    kind = tokenizer_json_kind(json.loads(path.read_text()))
    if kind == BYTE_LEVEL:
        _write_byte_level(writer, shape, read_bpe_vocab(hf_dir, shape.vocab_size, shape.bos_token_id))
    elif kind == SENTENCEPIECE:
        _write_sentencepiece(writer, shape, Path(hf_dir))
    else:
        raise UnsupportedModel(f"{path}: tokenizer kind {kind!r}; the GGUF export writes "
                               f"{BYTE_LEVEL} and {SENTENCEPIECE} tokenizers")
