"""Export an HF LLaMA directory to one ONNX file with explicit KV-cache inputs and outputs.

    python -m models.export.onnx --hf models/tandem-draft [--out FILE.onnx]

Graph signature (L layers, H_kv key/value heads, D head dim, S new tokens, P cached tokens):
    inputs   input_ids      int64   [1, S]
             position_ids   int64   [1, S]          absolute positions P .. P+S-1
             past_key_i     float32 [1, H_kv, P, D] for i in 0..L-1 (P = 0: an empty past)
             past_value_i   float32 [1, H_kv, P, D]
    outputs  logits         float32 [1, S, vocab]
             present_key_i  float32 [1, H_kv, P+S, D]
             present_value_i float32 [1, H_kv, P+S, D]
The causal mask is built inside the graph from position_ids, so a runtime feeds only ids,
positions and the past; rolling back is slicing the past along axis 2.

Legacy TorchScript exporter (dynamo=False): one self-contained file and no onnxscript
dependency; the model is loaded with eager attention so the graph has plain MatMul/Softmax ops.
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer

from models.export.hf_source import read_llama_shape

DEFAULT_NAME = "{model}.onnx"  # {model}: the HF directory's name
OPSET = 17


def past_names(num_layers: int, prefix: str) -> list[str]:
    """["{prefix}_key_0", "{prefix}_value_0", "{prefix}_key_1", ...]: the cache tensors in graph order."""
    return [f"{prefix}_{kind}_{i}" for i in range(num_layers) for kind in ("key", "value")]


def _cache_from(past: tuple[torch.Tensor, ...]) -> DynamicCache:
    """A DynamicCache whose layers start exactly at the given tensors.

    Set directly rather than via DynamicCache(ddp_cache_data=...): that path concatenates onto a
    1-D empty placeholder, which the tracer would bake into the graph as a rank-1 constant."""
    cache = DynamicCache()
    cache.layers = []
    for key, value in zip(past[0::2], past[1::2]):
        layer = DynamicLayer()
        layer.keys, layer.values = key, value
        layer.dtype, layer.device = key.dtype, key.device
        layer.is_initialized = True
        cache.layers.append(layer)
    return cache


class CachedDecoder(nn.Module):
    """(input_ids, position_ids, *past) -> (logits, *present) around an HF causal LM."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # input_ids, position_ids: [1, S]; past: 2L tensors [1, H_kv, P, D]
        n_past = past[0].shape[2]
        n_new = input_ids.shape[1]
        key_positions = torch.arange(n_past + n_new, device=input_ids.device)          # [P+S]
        allowed = key_positions[None, :] <= position_ids[0][:, None]                  # [S, P+S]
        # Additive float mask, as eager attention adds it to the scores; finfo.min, not -inf,
        # so a row can never become all -inf (NaN) even for odd position inputs.
        mask = torch.zeros(allowed.shape, dtype=torch.float32, device=input_ids.device)
        mask = mask.masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]  # [1, 1, S, P+S]
        cache = _cache_from(past)
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                         past_key_values=cache, use_cache=True)
        present = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def _pin_batch_dim(graph: onnx.ModelProto) -> None:
    """Declare batch = 1 on every output: unfolded shape arithmetic leaves the exporter
    naming it symbolically (e.g. "MatMullogits_dim_0"), which misdescribes the signature."""
    for value in graph.graph.output:
        dim = value.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_value = 1


def export_onnx(hf_dir: Path, out: Path | None = None) -> Path:
    hf_dir = Path(hf_dir)
    out = Path(out) if out is not None else hf_dir / DEFAULT_NAME.format(model=hf_dir.name)
    shape = read_llama_shape(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    wrapper = CachedDecoder(model).eval()

    # Trace with a non-empty past and several new tokens so no size is specialised to 0 or 1.
    n_past, n_new = 3, 2
    input_ids = torch.zeros((1, n_new), dtype=torch.int64)
    position_ids = torch.arange(n_past, n_past + n_new, dtype=torch.int64)[None]
    past = tuple(torch.zeros((1, shape.num_kv_heads, n_past, shape.head_dim), dtype=torch.float32)
                 for _ in range(2 * shape.num_layers))

    inputs = past_names(shape.num_layers, "past")
    outputs = past_names(shape.num_layers, "present")
    dynamic_axes = {"input_ids": {1: "seq"}, "position_ids": {1: "seq"}, "logits": {1: "seq"}}
    dynamic_axes |= {name: {2: "past"} for name in inputs}
    dynamic_axes |= {name: {2: "past_plus_seq"} for name in outputs}

    tmp = out.with_name(out.name + ".partial")
    # No constant folding: with tied embeddings it would store the transposed embedding as a
    # second initializer (+vocab*hidden floats on disk); ONNX Runtime folds it at load instead.
    with torch.no_grad(), warnings.catch_warnings():
        # The legacy exporter is chosen on purpose (see the module docstring): its deprecation
        # notice is not news to whoever runs this.
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx")
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*legacy TorchScript")
        torch.onnx.export(
            wrapper, (input_ids, position_ids, *past), str(tmp),
            input_names=["input_ids", "position_ids", *inputs],
            output_names=["logits", *outputs],
            dynamic_axes=dynamic_axes, opset_version=OPSET, dynamo=False, do_constant_folding=False,
        )
    graph = onnx.load(str(tmp))
    _pin_batch_dim(graph)
    onnx.checker.check_model(graph, full_check=True)
    onnx.save(graph, str(tmp))
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export an HF LLaMA directory to ONNX with KV-cache inputs/outputs.")
    parser.add_argument("--hf", type=Path, required=True, help="HF model directory")
    parser.add_argument("--out", type=Path, default=None, help=f"output file (default: DIR/{DEFAULT_NAME})")
    args = parser.parse_args(argv)
    out = export_onnx(args.hf, args.out)
    print(f"onnx: {args.hf} -> {out} ({out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
