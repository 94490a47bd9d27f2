"""Write an HF LLaMA directory as a GGUF file (f32 weights) that llama.cpp loads as is.

    python -m models.export.gguf --hf models/tandem-draft [--out FILE.gguf]

Written directly with the `gguf` package's GGUFWriter rather than llama.cpp's
convert_hf_to_gguf.py, which refuses a newly trained BPE tokenizer ("BPE pre-tokenizer was not
recognized"). What must be right for llama.cpp to read the same model as transformers:
  * tokenizer model "gpt2" with pre-tokenizer "gpt-2" (= ByteLevel with the GPT-2 regex; "default"
    splits digits and punctuation differently), merges as "a b" strings, CONTROL type for special
    tokens so that <|endoftext|> is one id with tokenize(..., special=True);
  * q and k projection rows permuted from HF's rotate-half rotary layout to llama.cpp's
    adjacent-pairs layout (see permute_for_rope);
  * tied embeddings: no output.weight is written, and llama.cpp then uses token_embd.weight
    for the output projection too.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np
from safetensors import safe_open

from models.export.hf_source import BpeVocab, LlamaShape, UnsupportedModel, read_bpe_vocab, read_llama_shape

DEFAULT_NAME = "{model}-f32.gguf"  # {model}: the HF directory's name


def permute_for_rope(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder the rows of a q/k projection [n_head * head_dim, ...] for llama.cpp's rope.

    HF's rotate_half pairs dim j with dim j + head_dim/2 inside each head; llama.cpp's (GPT-J
    style) rope pairs dims 2j and 2j + 1. Interleaving each head's two halves maps one onto the
    other (the same reshape as llama.cpp's converter, LlamaModel.permute)."""
    rows = weight.shape[0]
    assert rows % (2 * n_head) == 0, (rows, n_head)
    return (weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def read_safetensors(hf_dir: Path) -> dict[str, np.ndarray]:
    """All tensors of the directory's *.safetensors files (one file or shards) as float32 numpy."""
    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise UnsupportedModel(f"{hf_dir}: no *.safetensors file")
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        # framework="pt" reads bf16 too, which numpy cannot.
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name).float().numpy()
    return tensors


def gguf_tensors(hf_tensors: dict[str, np.ndarray], shape: LlamaShape) -> dict[str, np.ndarray]:
    """Map HF tensor names to GGUF names (gguf's own LLaMA name table), permuting q and k."""
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, shape.num_layers)
    out: dict[str, np.ndarray] = {}
    for hf_name, data in hf_tensors.items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue  # recomputed from rope_theta by every runtime
        if hf_name == "lm_head.weight" and shape.tie_word_embeddings:
            continue  # tied: llama.cpp falls back to token_embd.weight when output.weight is absent
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise UnsupportedModel(f"tensor {hf_name!r} has no GGUF name for architecture llama")
        if ".self_attn.q_proj." in hf_name:
            data = permute_for_rope(data, shape.num_heads)
        elif ".self_attn.k_proj." in hf_name:
            data = permute_for_rope(data, shape.num_kv_heads)
        out[name] = np.ascontiguousarray(data, dtype=np.float32)
    if "token_embd.weight" not in out:
        raise UnsupportedModel("no token embedding (model.embed_tokens.weight) in the safetensors")
    if not shape.tie_word_embeddings and "output.weight" not in out:
        raise UnsupportedModel("tie_word_embeddings is false but there is no lm_head.weight")
    return out


def _token_type(vocab: BpeVocab, idx: int) -> gguf.TokenType:
    if vocab.padding[idx]:
        return gguf.TokenType.UNUSED
    if vocab.special[idx]:
        return gguf.TokenType.CONTROL
    if vocab.added[idx]:
        return gguf.TokenType.USER_DEFINED
    return gguf.TokenType.NORMAL


def _write_metadata(writer: gguf.GGUFWriter, shape: LlamaShape, name: str) -> None:
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(shape.max_positions)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_block_count(shape.num_layers)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    # Explicit, since head_dim need not be hidden_size / num_heads in a LLaMA config.
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    writer.add_vocab_size(shape.vocab_size)


def _write_tokenizer(writer: gguf.GGUFWriter, shape: LlamaShape, vocab: BpeVocab) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
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


def export_gguf(hf_dir: Path, out: Path | None = None) -> Path:
    hf_dir = Path(hf_dir)
    out = Path(out) if out is not None else hf_dir / DEFAULT_NAME.format(model=hf_dir.name)
    shape = read_llama_shape(hf_dir)
    vocab = read_bpe_vocab(hf_dir, shape.vocab_size, shape.bos_token_id)
    tensors = gguf_tensors(read_safetensors(hf_dir), shape)

    tmp = out.with_name(out.name + ".partial")  # never leave a half-written file under the real name
    writer = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    _write_metadata(writer, shape, hf_dir.name)
    _write_tokenizer(writer, shape, vocab)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export an HF LLaMA directory to an f32 GGUF file.")
    parser.add_argument("--hf", type=Path, required=True, help="HF model directory")
    parser.add_argument("--out", type=Path, default=None, help=f"output file (default: DIR/{DEFAULT_NAME})")
    args = parser.parse_args(argv)
    out = export_gguf(args.hf, args.out)
    print(f"gguf: {args.hf} -> {out} ({out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
