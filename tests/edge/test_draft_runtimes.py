"""The three draft runtimes (llama.cpp, ONNX Runtime, torch) on the shipped draft and its exports.

torch is the reference: the HF model in float32. The other two must give the same next-token
distributions on held-out text, keep doing so across rollback and re-extend, and read the
same vocabulary as the HF tokenizer the edge tokenizes with."""
from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench import runtimes as bench_runtimes
from edge.runtime import ContextFull, DraftConfig, DraftRuntime, MissingBackend, load_draft_runtime
from models.export.gguf import export_gguf
from tandem.fingerprint import tokenizer_fingerprint

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["llama.cpp", "onnxruntime", "torch"]
EXPORTED = ["llama.cpp", "onnxruntime"]
# f32 everywhere: measured differences against torch are ~1e-6 (RUNTIME-NOTES); 1e-3 still
# catches any layout error (a wrong rope permutation or mask moves logits by O(0.1)).
MAX_LOGIT_DIFF = 1e-3
# Argmax is compared only where torch's top-2 margin exceeds this: below it, a 1e-6 numeric
# difference may legitimately flip the argmax. Randomly initialised dev models are full of such
# near-ties; on the trained draft almost every position counts.
TIE_MARGIN = 1e-3
TOKENS_PER_FILE = 128
N_FILES = 3


def heldout_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = (ROOT / "models/heldout_files.txt").read_text().split()
    return [stdlib / name for name in names if (stdlib / name).is_file()]


@pytest.fixture(scope="module")
def hf_tokenizer(draft_dir) -> Tokenizer:
    return Tokenizer.from_file(str(draft_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def heldout_chunks(hf_tokenizer) -> list[list[int]]:
    """The first TOKENS_PER_FILE tokens of the first N_FILES held-out source files that long."""
    encoded = (hf_tokenizer.encode(f.read_text()).ids for f in heldout_files())
    chunks = [ids[:TOKENS_PER_FILE] for ids in encoded if len(ids) >= TOKENS_PER_FILE][:N_FILES]
    assert len(chunks) == N_FILES, "held-out stdlib files missing"
    return chunks


@pytest.fixture(scope="module")
def reference_logits(draft_dir, heldout_chunks) -> list[torch.Tensor]:
    """One cache-free forward pass of the HF model per chunk: [len(chunk), vocab] each."""
    model = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(torch.tensor([chunk])).logits[0] for chunk in heldout_chunks]


def config_for(backend: str, draft_dir: Path, gguf_path: Path, onnx_path: Path, **kw) -> DraftConfig:
    path = {"llama.cpp": gguf_path, "onnxruntime": onnx_path, "torch": draft_dir}[backend]
    return DraftConfig(backend=backend, model_path=path, threads=1, **kw)


@pytest.fixture(scope="module")
def runtimes(draft_dir, gguf_path, onnx_path):
    torch_threads = torch.get_num_threads()  # the torch runtime sets it process-wide; put it back after
    loaded = {b: load_draft_runtime(config_for(b, draft_dir, gguf_path, onnx_path, n_ctx=512)) for b in BACKENDS}
    yield loaded
    for runtime in loaded.values():
        runtime.close()
    torch.set_num_threads(torch_threads)


def run_mixed(runtime: DraftRuntime, chunk: list[int]) -> torch.Tensor:
    """Logits [len(chunk), vocab] fed the way the edge feeds them: a prompt prefill, a block
    of a few tokens, then single-token decode steps."""
    cut1, cut2 = len(chunk) // 2, len(chunk) // 2 + 5
    runtime.rollback(0)
    rows = [runtime.extend(chunk[:cut1]), runtime.extend(chunk[cut1:cut2])]
    rows += [runtime.extend([t]) for t in chunk[cut2:]]
    assert runtime.position == len(chunk)
    return torch.cat(rows)


@pytest.mark.parametrize("backend", BACKENDS)
def test_distributions_match_torch_reference(backend, runtimes, heldout_chunks, reference_logits,
                                             record_property):
    runtime = runtimes[backend]
    got = torch.cat([run_mixed(runtime, chunk) for chunk in heldout_chunks])          # [N, vocab]
    ref = torch.cat(reference_logits)                                                  # [N, vocab]
    assert got.shape == ref.shape and got.dtype == torch.float32

    max_diff = (got - ref).abs().max().item()
    top2 = ref.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > TIE_MARGIN
    agreement = (got.argmax(-1) == ref.argmax(-1))[decided].float().mean().item()
    record_property("max_abs_logit_diff", max_diff)
    record_property("argmax_agreement", agreement)
    print(f"{backend}: {len(ref)} positions ({int(decided.sum())} without near-ties), "
          f"max |logit diff| {max_diff:.2e}, argmax agreement {agreement:.4f}")
    assert decided.float().mean() > 0.5, "too few decided positions for the comparison to mean anything"
    assert max_diff < MAX_LOGIT_DIFF
    assert agreement >= 0.99


@pytest.mark.parametrize("backend", BACKENDS)
def test_rollback_then_reextend_equals_fresh_run(backend, runtimes, heldout_chunks):
    runtime = runtimes[backend]
    chunk = heldout_chunks[0]
    prefix, block = chunk[:64], chunk[64:72]
    accepted = 3
    # A drafted block whose first `accepted` tokens the target keeps and whose rest it refuses.
    drafted = block[:accepted] + [(t + 1) % runtime.vocab_size for t in block[accepted:]]

    after_prefix = runtime.prefill(prefix)                                             # [vocab]
    fresh = runtime.extend(block)                                                      # [8, vocab]

    runtime.prefill(prefix)
    runtime.extend(drafted)
    runtime.rollback(len(prefix) + accepted)
    assert runtime.position == len(prefix) + accepted
    again = runtime.extend(block[accepted:])                                           # [5, vocab]
    assert (again - fresh[accepted:]).abs().max().item() < 1e-4

    # prefill() on a non-empty cache is a reset, not an append.
    again_prefix = runtime.prefill(prefix)
    assert runtime.position == len(prefix)
    assert again_prefix.shape == (runtime.vocab_size,)
    assert (again_prefix - after_prefix).abs().max().item() < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_arguments_are_refused(backend, runtimes):
    runtime = runtimes[backend]
    runtime.prefill([1, 2, 3])
    with pytest.raises(ValueError, match="rollback"):
        runtime.rollback(4)
    with pytest.raises(ValueError, match="rollback"):
        runtime.rollback(-1)
    with pytest.raises(ValueError, match="vocabulary"):
        runtime.extend([runtime.vocab_size])
    with pytest.raises(ValueError, match="at least one"):
        runtime.extend([])
    with pytest.raises(ContextFull):
        runtime.extend([1] * (runtime.n_ctx - 2))
    assert runtime.position == 3, "a refused extend must leave the cache as it was"
    assert torch.isfinite(runtime.extend([1] * (runtime.n_ctx - 3))).all()  # exactly full is fine
    assert runtime.position == runtime.n_ctx


def test_llama_cpp_context_is_what_was_asked(gguf_path):
    """llama.cpp rounds small contexts up internally; the runtime must still hold n_ctx tokens."""
    runtime = load_draft_runtime(DraftConfig(backend="llama.cpp", model_path=gguf_path, n_ctx=20, threads=1))
    try:
        assert runtime.n_ctx == 20
        assert runtime.extend(list(range(1, 21))).shape == (20, runtime.vocab_size)
        with pytest.raises(ContextFull):
            runtime.extend([1])
    finally:
        runtime.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_speed_counts_prefill_and_decode_separately(backend, runtimes):
    runtime = runtimes[backend]
    runtime.rollback(0)
    before = runtime.speed.prefill_tokens, runtime.speed.decode_tokens
    runtime.extend([5, 6, 7, 8])
    runtime.extend([9])
    runtime.extend([10])
    assert runtime.speed.prefill_tokens - before[0] == 4
    assert runtime.speed.decode_tokens - before[1] == 2
    assert runtime.speed.decode_tok_s > 0 and runtime.speed.prefill_tok_s > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_fingerprint_equals_hf_tokenizer(backend, runtimes, draft_dir):
    expected = tokenizer_fingerprint(AutoTokenizer.from_pretrained(draft_dir))
    assert runtimes[backend].fingerprint() == expected


def test_gguf_fingerprint_comes_from_its_own_vocabulary(tmp_path, draft_dir, runtimes):
    """A GGUF written from a tokenizer with two token strings swapped must not pass as ours."""
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((draft_dir / name).read_bytes())
    raw = json.loads((draft_dir / "tokenizer.json").read_text())
    vocab = raw["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / "tokenizer.json").write_text(json.dumps(raw))
    other = load_draft_runtime(DraftConfig(backend="llama.cpp", model_path=export_gguf(tmp_path), n_ctx=64))
    try:
        assert other.fingerprint() != runtimes["llama.cpp"].fingerprint()
    finally:
        other.close()


def test_llama_cpp_tokenizer_matches_hf(runtimes, hf_tokenizer, heldout_prompts):
    """The GGUF's own tokenizer and the HF tokenizers library give the same ids, on every whole
    held-out file, every held-out prompt and a special token in running text."""
    llm = runtimes["llama.cpp"].llm
    texts = [f.read_text() for f in heldout_files()] + heldout_prompts
    texts.append("x = 1<|endoftext|>def f():\n\treturn 'é' + \"\\u00e9\"  # 12345 ...\n")
    assert len(texts) > 200
    for text in texts:
        hf_ids = hf_tokenizer.encode(text).ids
        llama_ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        assert llama_ids == hf_ids, f"first difference in {text[:60]!r}"
    eos = hf_tokenizer.token_to_id("<|endoftext|>")
    assert eos in hf_tokenizer.encode(texts[-1]).ids


@pytest.mark.parametrize("backend", EXPORTED)
def test_missing_backend_package_names_it(backend, monkeypatch, draft_dir, gguf_path, onnx_path):
    package, pip_name = {"llama.cpp": ("llama_cpp", "llama-cpp-python"),
                         "onnxruntime": ("onnxruntime", "onnxruntime")}[backend]
    # None in sys.modules makes `import package` raise ImportError, as on a device without it.
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(MissingBackend, match=f"pip install {pip_name}"):
        load_draft_runtime(config_for(backend, draft_dir, gguf_path, onnx_path))


def test_missing_model_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_draft_runtime(DraftConfig(backend="onnxruntime", model_path=tmp_path / "nope.onnx"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_draft_runtime(DraftConfig(backend="torch", model_path=tmp_path))


def test_config_defaults_and_validation(tmp_path):
    gguf_config = DraftConfig(model_path=tmp_path / "d" / "x.gguf")
    assert gguf_config.resolved_tokenizer_dir == tmp_path / "d"
    assert DraftConfig(backend="torch", model_path=tmp_path).resolved_tokenizer_dir == tmp_path
    assert DraftConfig(tokenizer_dir=tmp_path / "t").resolved_tokenizer_dir == tmp_path / "t"
    with pytest.raises(ValueError):
        DraftConfig(backend="tensorrt")
    with pytest.raises(ValueError):
        DraftConfig(threads=0)
    with pytest.raises(ValueError):
        DraftConfig(n_thread=2)  # unknown keys are errors, not silently ignored


def test_bench_runtimes_smoke(tmp_path, capsys, draft_dir, target_dir, gguf_path, onnx_path):
    """bench.runtimes with tiny sizes: every backend and the target report tokens/s."""
    out = tmp_path / "runtimes.json"
    torch_threads = torch.get_num_threads()
    try:
        bench_runtimes.main(["--draft", str(draft_dir), "--gguf", str(gguf_path), "--onnx", str(onnx_path),
                             "--target", str(target_dir), "--prefill-tokens", "16", "--decode-tokens", "4",
                             "--repeats", "1", "--threads", "1", "--json", str(out)])
    finally:
        torch.set_num_threads(torch_threads)
    rows = json.loads(out.read_text())["rows"]
    assert [r["runtime"] for r in rows] == ["llama.cpp", "onnxruntime", "torch", "small llama.cpp",
                                            "small onnxruntime", "small torch", "target (torch)"]
    assert all(r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 for r in rows)
    assert all(r["prefill_tokens"] == 16 and r["decode_tokens"] == 4 for r in rows)
    assert "decode tok/s" in capsys.readouterr().out


@pytest.mark.parametrize("backend", EXPORTED)
def test_small_model_exports_match_torch(backend, small_dir, draft_dir, heldout_chunks):
    """The ladder's small model: its GGUF and ONNX give torch's logits, fed like the edge feeds."""
    paths = {"llama.cpp": small_dir / "tandem-small-f32.gguf", "onnxruntime": small_dir / "tandem-small.onnx"}
    chunk = heldout_chunks[0]
    model = AutoModelForCausalLM.from_pretrained(small_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([chunk])).logits[0]
    torch_threads = torch.get_num_threads()
    runtime = load_draft_runtime(DraftConfig(backend=backend, model_path=paths[backend], threads=1, n_ctx=256))
    try:
        got = run_mixed(runtime, chunk)
        # Same tokenizer as the draft: the verifier accepts either rung's blocks.
        assert runtime.fingerprint() == tokenizer_fingerprint(AutoTokenizer.from_pretrained(draft_dir))
    finally:
        runtime.close()
        torch.set_num_threads(torch_threads)
    assert (got - ref).abs().max().item() < MAX_LOGIT_DIFF
