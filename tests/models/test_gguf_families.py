"""Drafts beyond LLaMA: a tiny random-weight Qwen2 (biases in q/k/v, NEOX rope) exported by
models.export.gguf runs on llama.cpp (edge's LlamaDraftRuntime) with the greedy tokens of its HF
form and the HF tokenizer's fingerprint, and so does a draft with a SentencePiece-style
tokenizer; families the exporter does not write, and features llama.cpp's graph would get
wrong, are refused in one line. (The other families it writes: test_e2e_draft_families.py.)"""
from __future__ import annotations

import json
import shutil
from unittest import mock

import llama_cpp
import pytest
from draft_families import PROMPT, ROOT, build, check_gguf_equals_hf, hf_greedy, runtime_greedy
from gguf import GGUFReader
from spm_tokenizer import save, train_bpe
from tokenizers import Tokenizer
from transformers import AutoTokenizer, LlamaConfig, MistralConfig, Qwen2Config

from edge.runtime.llama_runtime import LlamaDraftRuntime
from models.export import gguf as exporter
from models.export.gguf import export_gguf
from models.export.hf_source import SPLIT_PRE_TOKENIZERS, UnsupportedModel
from tandem.fingerprint import tokenizer_fingerprint

pytestmark = pytest.mark.unit  # no server: exporter and llama.cpp runtime in process

@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    return build("qwen2", tmp_path_factory.mktemp("qwen2"))


def test_qwen2_gguf_greedy_equals_hf(qwen2_dir, tmp_path):
    """Qwen2: biases in the q/k/v projections, NEOX rope, tied output."""
    check_gguf_equals_hf(qwen2_dir, export_gguf(qwen2_dir, tmp_path / "q.gguf"), "qwen2")


def test_qwen2_rope_is_not_permuted(qwen2_dir, tmp_path):
    """Token identity depends on it: the same weights written with llama's q/k permutation
    (rotating other pairs than llama.cpp's NEOX rope for qwen2 does) give other logits."""
    right = LlamaDraftRuntime(export_gguf(qwen2_dir, tmp_path / "right.gguf"), n_ctx=64)
    with mock.patch.dict(exporter.FAMILIES, {"qwen2": (exporter.FAMILIES["qwen2"][0], True)}):
        wrong = LlamaDraftRuntime(export_gguf(qwen2_dir, tmp_path / "wrong.gguf"), n_ctx=64)
    try:
        assert (right.extend(PROMPT) - wrong.extend(PROMPT)).abs().max() > 1e-2
    finally:
        right.close()
        wrong.close()


def test_sentencepiece_draft_gguf_keeps_ids_and_fingerprint(tmp_path):
    """A draft with a byte-fallback SentencePiece-style tokenizer: the GGUF holds llama.cpp's
    "llama" vocabulary (written by the gguf package's own LlamaHfVocab), the same token strings,
    so the runtime's fingerprint is the HF tokenizer's, of the sentencepiece kind."""
    tokenizer = train_bpe()
    tok_dir = save(tokenizer, tmp_path / "spm")
    n_vocab = tokenizer.get_vocab_size()
    hf_dir = build("llama", tmp_path / "llama-spm", tokenizer_dir=tok_dir, vocab_size=n_vocab, eos_id=2)
    export_gguf(hf_dir, tmp_path / "spm.gguf")
    reader = GGUFReader(tmp_path / "spm.gguf")
    assert reader.fields["tokenizer.ggml.model"].contents() == "llama"
    runtime = LlamaDraftRuntime(tmp_path / "spm.gguf", n_ctx=64)
    try:
        prompt = [1, 40, 300, 5, 270, 61]
        assert runtime_greedy(runtime, prompt, 12) == hf_greedy(hf_dir, prompt, 12)
        hf_print = tokenizer_fingerprint(AutoTokenizer.from_pretrained(hf_dir))
        assert runtime.fingerprint() == hf_print
        assert hf_print != tokenizer_fingerprint(AutoTokenizer.from_pretrained(ROOT / "models/tokenizer"))
    finally:
        runtime.close()


@pytest.mark.parametrize("model_type, says", [
    ("gpt_neox", "llama.cpp has it (architecture 'gptneox')"),
    ("phi3", "llama.cpp has it (architecture 'phi3')"),
    ("tandem_custom", "llama.cpp has no architecture of that name"),
])
def test_other_families_refused_in_one_line(tmp_path, capsys, model_type, says):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(SystemExit) as exited:
        exporter.main(["--hf", str(tmp_path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"model_type {model_type!r}" in err and says in err
    assert "llama, mistral, qwen2, qwen3" in err


@pytest.mark.parametrize("config, says", [
    (Qwen2Config(use_sliding_window=True, sliding_window=32), "sliding_window 32"),
    (MistralConfig(sliding_window=64, max_position_embeddings=512), "sliding_window 64"),
    (LlamaConfig(hidden_act="gelu"), "hidden_act 'gelu'"),
    (LlamaConfig(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
     "rope_type 'linear'"),
])
def test_features_llama_cpp_would_get_wrong_are_refused(tmp_path, config, says):
    config.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModel, match=says):
        export_gguf(tmp_path, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


TOKENIZE_TEXTS = ["x = 2024 + 1234567 - 00\n", "We're 3 they'll\n\n  spaced   out\tdone", "def f(a):\n    return a*255"]


@pytest.mark.parametrize("pre, name", [("qwen2", "qwen2"), ("llama3", "llama-bpe")])
def test_split_pre_tokenizers_get_llama_cpp_names(qwen2_dir, tmp_path, pre, name):
    """A real Qwen2 or Llama-3 tokenizer.json splits with a regex before ByteLevel: the GGUF names
    llama.cpp's pre-tokenizer for it, and llama.cpp then tokenizes text as the HF tokenizer does
    (the edge tokenizes with HF, so this matters only to the file's other users)."""
    digits = "\\p{N}" if pre == "qwen2" else "\\p{N}{1,3}"
    regex = next(r for r, n in SPLIT_PRE_TOKENIZERS.items() if n == name)
    assert digits in regex
    hf_dir = tmp_path / pre
    shutil.copytree(qwen2_dir, hf_dir)
    spec = json.loads((hf_dir / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    (hf_dir / "tokenizer.json").write_text(json.dumps(spec))
    reader = GGUFReader(export_gguf(hf_dir, tmp_path / "t.gguf"))
    assert reader.fields["tokenizer.ggml.pre"].contents() == name
    hf = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    cpp = llama_cpp.Llama(str(tmp_path / "t.gguf"), vocab_only=True, verbose=False)
    gpt2 = Tokenizer.from_file(str(ROOT / "models/tokenizer/tokenizer.json"))
    try:
        for text in TOKENIZE_TEXTS:
            ids = hf.encode(text, add_special_tokens=False).ids
            assert cpp.tokenize(text.encode(), add_bos=False, special=False) == ids, text
        # The split is observable: GPT-2's regex keeps " 2024" whole and merges its digits.
        assert gpt2.encode(TOKENIZE_TEXTS[0]).ids != hf.encode(TOKENIZE_TEXTS[0]).ids
    finally:
        cpp.close()
