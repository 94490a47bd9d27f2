"""Write an HF directory of a LLaMA-like decoder as a GGUF file (f32 weights) that llama.cpp
loads as is.

    python -m models.export.gguf --hf models/tandem-draft [--out FILE.gguf]

Families (config.json model_type) and llama.cpp architectures, as llama.cpp's own converter
(convert_hf_to_gguf.py) maps them: llama and mistral -> "llama", qwen2 -> "qwen2" (biases in the
q/k/v projections), qwen3 -> "qwen3" (RMSNorm on q and k). Any other family is refused in one
line that says whether llama.cpp has an architecture of that name. convert_hf_to_gguf.py itself
is in no installed package (only in llama-cpp-python's source archive), so the file is written
with the `gguf` package: its GGUFWriter, its per-architecture tensor name tables and, for
SentencePiece tokenizers, its vocabulary readers (models/export/gguf_tokenizer.py). What must be
right for llama.cpp to read the same model as transformers:
  * the tokenizer strings and special ids (gguf_tokenizer.py);
  * rope: llama.cpp's "llama" rotates adjacent pairs (GPT-J style), so q and k projection rows
    are permuted from HF's rotate-half layout (see permute_for_rope); its "qwen2"/"qwen3" use
    NEOX rope, which is HF's layout as is: no permutation;
  * tied embeddings: no output.weight is written, and llama.cpp then uses token_embd.weight
    for the output projection too.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import gguf
import numpy as np
from safetensors import safe_open

from models.export.gguf_tokenizer import write_tokenizer
from models.export.hf_source import LlamaShape, UnsupportedModel, read_llama_shape

DEFAULT_NAME = "{model}-f32.gguf"  # {model}: the HF directory's name

# model_type -> (llama.cpp architecture, whether q/k rows are permuted for its rope).
FAMILIES: dict[str, tuple[gguf.MODEL_ARCH, bool]] = {
    "llama": (gguf.MODEL_ARCH.LLAMA, True),
    "mistral": (gguf.MODEL_ARCH.LLAMA, True),   # without a window shorter than the context
    "qwen2": (gguf.MODEL_ARCH.QWEN2, False),
    "qwen3": (gguf.MODEL_ARCH.QWEN3, False),
}


def _normal(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def check_family(hf_dir: Path) -> None:
    """UnsupportedModel, in one line, for a model_type outside FAMILIES."""
    model_type = json.loads((Path(hf_dir) / "config.json").read_text()).get("model_type")
    if model_type in FAMILIES:
        return
    arch = next((n for n in gguf.MODEL_ARCH_NAMES.values() if _normal(n) == _normal(str(model_type))), None)
    where = (f"llama.cpp has it (architecture {arch!r}): convert it with llama.cpp's "
             f"convert_hf_to_gguf.py" if arch else "llama.cpp has no architecture of that name")
    raise UnsupportedModel(f"{hf_dir}: model_type {model_type!r} is not exported here "
                           f"(only {', '.join(FAMILIES)}); {where}")


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
    """Map HF tensor names to GGUF names (gguf's own table for the family's architecture),
    permuting q and k where llama.cpp's rope for it wants that."""
    arch, permute = FAMILIES[shape.model_type]
    name_map = gguf.get_tensor_name_map(arch, shape.num_layers)
    out: dict[str, np.ndarray] = {}
    for hf_name, data in hf_tensors.items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue  # recomputed from rope_theta by every runtime
        if hf_name == "lm_head.weight" and shape.tie_word_embeddings:
            continue  # tied: llama.cpp falls back to token_embd.weight when output.weight is absent
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise UnsupportedModel(f"tensor {hf_name!r} has no GGUF name for architecture "
                                   f"{gguf.MODEL_ARCH_NAMES[arch]}")
        if permute and ".self_attn.q_proj." in hf_name:
            data = permute_for_rope(data, shape.num_heads)
        elif permute and ".self_attn.k_proj." in hf_name:
            data = permute_for_rope(data, shape.num_kv_heads)
        out[name] = np.ascontiguousarray(data, dtype=np.float32)
    if "token_embd.weight" not in out:
        raise UnsupportedModel("no token embedding (model.embed_tokens.weight) in the safetensors")
    if not shape.tie_word_embeddings and "output.weight" not in out:
        raise UnsupportedModel("tie_word_embeddings is false but there is no lm_head.weight")
    return out


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


def export_gguf(hf_dir: Path, out: Path | None = None) -> Path:
    hf_dir = Path(hf_dir)
    out = Path(out) if out is not None else hf_dir / DEFAULT_NAME.format(model=hf_dir.name)
    check_family(hf_dir)
    shape = read_llama_shape(hf_dir, tuple(FAMILIES))
    tensors = gguf_tensors(read_safetensors(hf_dir), shape)

    tmp = out.with_name(out.name + ".partial")  # never leave a half-written file under the real name
    writer = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[FAMILIES[shape.model_type][0]])
    _write_metadata(writer, shape, hf_dir.name)
    write_tokenizer(writer, shape, hf_dir)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=f"Export an HF directory ({', '.join(FAMILIES)}) to an f32 GGUF file.")
    parser.add_argument("--hf", type=Path, required=True, help="HF model directory")
    parser.add_argument("--out", type=Path, default=None, help=f"output file (default: DIR/{DEFAULT_NAME})")
    args = parser.parse_args(argv)
    try:
        out = export_gguf(args.hf, args.out)
    except UnsupportedModel as err:  # one line, not a traceback: the user's model, not our bug
        parser.exit(2, f"gguf: {err}\n")
    print(f"gguf: {args.hf} -> {out} ({out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
