"""The shipped local models' HF directories (tandem-draft, tandem-small) and their exports
(models.export.gguf / models.export.onnx).

Numerical agreement of the shipped GGUF and ONNX files with torch is checked in
test_draft_runtimes.py; here: the files are what the exporters write, their metadata and
signatures are what the runtimes rely on, and the exporters work on LLaMA shapes other than
ours (grouped-query attention, head_dim != hidden/heads, untied output, other rope theta)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from gguf import GGUFReader, TokenType
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import rotate_half

from edge.runtime.llama_runtime import LlamaDraftRuntime
from edge.runtime.onnx_runtime import OnnxDraftRuntime
from models.export import gguf as gguf_export
from models.export import onnx as onnx_export
from models.export.gguf import export_gguf, permute_for_rope

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)


def gguf_field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def test_hf_dirs_load_as_is(draft_dir, target_dir, small_dir):
    for model_dir in (draft_dir, target_dir, small_dir):
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        text = "def f(x):\n    return x + 1<|endoftext|>"
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert ids[-1] == tokenizer.eos_token_id == model.config.eos_token_id
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits
        assert logits.shape == (1, len(ids), model.config.vocab_size)
        assert torch.isfinite(logits).all()


def test_permute_for_rope_turns_hf_rotary_into_llama_cpp_rotary():
    """llama.cpp rotates adjacent pairs (2j, 2j+1); HF rotates (j, j + D/2). Rope applied to the
    permuted projection must be the permuted HF rope, head by head, so q.k is unchanged."""
    n_head, head_dim, hidden, pos, theta = 3, 8, 10, 7, 10000.0
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((n_head * head_dim, hidden)).astype(np.float32)
    x = rng.standard_normal(hidden).astype(np.float32)
    inv_freq = theta ** (-np.arange(0, head_dim, 2) / head_dim)                       # [D/2]
    angles = pos * inv_freq

    q = torch.from_numpy((weight @ x).reshape(n_head, head_dim))
    cos = torch.from_numpy(np.cos(np.concatenate([angles, angles]))).float()
    sin = torch.from_numpy(np.sin(np.concatenate([angles, angles]))).float()
    hf_rope = (q * cos + rotate_half(q) * sin).numpy().reshape(-1)                    # [n_head * D]

    y = (permute_for_rope(weight, n_head) @ x).reshape(n_head, head_dim // 2, 2)
    even, odd = y[..., 0], y[..., 1]
    llama_rope = np.stack([even * np.cos(angles) - odd * np.sin(angles),
                           even * np.sin(angles) + odd * np.cos(angles)], axis=-1).reshape(-1)

    np.testing.assert_allclose(llama_rope, permute_for_rope(hf_rope, n_head), rtol=1e-5, atol=1e-5)


def test_shipped_gguf_is_a_fresh_export(tmp_path, local_model):
    """The shipped file is what the exporter writes from the shipped HF directory now."""
    draft_dir, gguf_path = local_model["dir"], local_model["gguf"]
    shipped, fresh = GGUFReader(gguf_path), GGUFReader(export_gguf(draft_dir, tmp_path / "fresh.gguf"))
    config = json.loads((draft_dir / "config.json").read_text())
    tokenizer = json.loads((draft_dir / "tokenizer.json").read_text())

    assert gguf_field(shipped, "general.architecture") == "llama"
    assert gguf_field(shipped, "tokenizer.ggml.model") == "gpt2"
    assert gguf_field(shipped, "tokenizer.ggml.pre") == "gpt-2"
    assert gguf_field(shipped, "llama.rope.freq_base") == pytest.approx(config["rope_parameters"]["rope_theta"])
    assert gguf_field(shipped, "llama.attention.head_count_kv") == config["num_key_value_heads"]
    assert gguf_field(shipped, "tokenizer.ggml.eos_token_id") == config["eos_token_id"]
    assert gguf_field(shipped, "tokenizer.ggml.add_bos_token") is False

    tokens = gguf_field(shipped, "tokenizer.ggml.tokens")
    types = gguf_field(shipped, "tokenizer.ggml.token_type")
    merges = gguf_field(shipped, "tokenizer.ggml.merges")
    vocab = tokenizer["model"]["vocab"]
    assert len(tokens) == config["vocab_size"] and all(tokens[i] == t for t, i in vocab.items())
    assert merges == [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    special = {t["id"] for t in tokenizer["added_tokens"] if t["special"]}
    assert special and all(types[i] == TokenType.CONTROL for i in special)
    assert sum(t == TokenType.NORMAL for t in types) == len(types) - len(special)

    names = {t.name for t in shipped.tensors}
    assert len(names) == 2 + 9 * config["num_hidden_layers"]  # embedding + final norm + 9 per block
    # Tied embeddings: no output.weight; llama.cpp projects with token_embd.weight.
    assert config["tie_word_embeddings"] and "output.weight" not in names
    assert all(t.tensor_type == 0 for t in shipped.tensors)  # GGML_TYPE_F32
    fresh_tensors = {t.name: t for t in fresh.tensors}
    for tensor in shipped.tensors:
        np.testing.assert_array_equal(tensor.data, fresh_tensors[tensor.name].data, err_msg=tensor.name)


def test_shipped_onnx_signature(local_model):
    onnx_path, draft_dir = local_model["onnx"], local_model["dir"]
    config = json.loads((draft_dir / "config.json").read_text())
    model = onnx.load(str(onnx_path), load_external_data=False)
    assert [op.version for op in model.opset_import if op.domain in ("", "ai.onnx")] == [onnx_export.OPSET]
    external = [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert not external, "the export must be one self-contained file"

    def dims(value):
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    layers, kv_heads = config["num_hidden_layers"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    inputs = {v.name: dims(v) for v in model.graph.input}
    outputs = {v.name: dims(v) for v in model.graph.output}
    assert list(inputs) == ["input_ids", "position_ids", *onnx_export.past_names(layers, "past")]
    assert list(outputs) == ["logits", *onnx_export.past_names(layers, "present")]
    assert inputs["input_ids"] == inputs["position_ids"] == [1, "seq"]
    assert inputs["past_key_0"] == [1, kv_heads, "past", head_dim]
    assert outputs["present_value_0"] == [1, kv_heads, "past_plus_seq", head_dim]
    assert outputs["logits"] == [1, "seq", config["vocab_size"]]


@pytest.fixture(scope="module")
def other_llama_dir(tmp_path_factory, draft_dir) -> Path:
    """A tiny random LLaMA unlike ours in every number the exporters read from the config."""
    out = tmp_path_factory.mktemp("other-llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24,       # GQA, head_dim != 64/4
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
        # Large init so logits spread over O(1): a layout error then shows as a big difference.
        initializer_range=0.2, rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    LlamaForCausalLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(draft_dir / name, out / name)
    return out


def test_exporters_handle_other_llama_shapes(other_llama_dir, heldout_prompts):
    """CLI with default output names on a GQA, untied, non-square-head model; both files give
    torch's logits through the edge runtimes, prefill and decode."""
    gguf_export.main(["--hf", str(other_llama_dir)])
    onnx_export.main(["--hf", str(other_llama_dir)])
    # Default names follow the HF directory's name.
    gguf_file = other_llama_dir / f"{other_llama_dir.name}-f32.gguf"
    onnx_file = other_llama_dir / f"{other_llama_dir.name}.onnx"
    assert gguf_file.is_file() and onnx_file.is_file()
    assert "output.weight" in {t.name for t in GGUFReader(gguf_file).tensors}  # untied: written

    tokenizer = AutoTokenizer.from_pretrained(other_llama_dir)
    ids = tokenizer("".join(heldout_prompts[:4]))["input_ids"][:96]
    model = AutoModelForCausalLM.from_pretrained(other_llama_dir).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]                                     # [96, vocab]
    assert ref.std() > 0.5, "logits too flat for the comparison to catch a layout error"

    for runtime in (LlamaDraftRuntime(gguf_file, n_ctx=128),
                    OnnxDraftRuntime(onnx_file, tokenizer_dir=other_llama_dir, n_ctx=128)):
        got = torch.cat([runtime.extend(ids[:80])] + [runtime.extend([t]) for t in ids[80:]])
        runtime.close()
        assert (got - ref).abs().max().item() < 1e-3, runtime.name
