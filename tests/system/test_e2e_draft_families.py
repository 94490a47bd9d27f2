"""Drafts beyond LLaMA, end to end.

* Every family models.export.gguf writes runs on llama.cpp with its HF form's greedy tokens.
* A Qwen2-style draft on llama.cpp speculates against a Qwen2-style target served by the real
  verifier (loopback gRPC): the greedy output is token for token the target's own
  (transformers' generate of the target alone). Two drafts: the target's own weights exported
  to GGUF (every draft accepted) and an unrelated random Qwen2 (most rejected), so both the
  accepting and the correcting paths run on this family.
* A model with a SentencePiece-style byte-fallback tokenizer, served by the verifier and drafted
  by its GGUF through the edge daemon: the verifier accepts the draft's fingerprint (the same
  kind on both sides), and the streamed text is the target's greedy text, whole."""
from __future__ import annotations

import openai
import pytest
import torch
from draft_families import build, check_gguf_equals_hf
from spm_tokenizer import MULTIBYTE_TEXT, save, train_bpe
from verifier_harness import Reference, channel_to, client_for, start_verifier

from cloud.runtime.target import TargetRuntime
from edge.request import GenerationRequest
from edge.config import ClientConfig, CloudLinkConfig, DaemonConfig, EdgeConfig
from edge.daemon.server import DaemonThread, load_pool
from edge.runtime import DraftConfig
from edge.runtime.llama_runtime import LlamaDraftRuntime
from edge.tokenizer import EdgeTokenizer
from models.export.gguf import export_gguf

pytestmark = pytest.mark.e2e  # real verifier (and daemon) on loopback sockets

torch.set_num_threads(1)

NEW_TOKENS = 32
PROMPTS = [[17, 905, 33, 2048, 7, 311], [1200, 5, 5, 88, 3000], [42] * 3 + [77, 1024, 9, 2, 650]]


@pytest.mark.parametrize("family, overrides, arch", [
    ("qwen2", {"tie_word_embeddings": False}, "qwen2"),   # its own lm_head
    ("qwen3", {"head_dim": 32}, "qwen3"),                # q/k norms, head_dim != hidden/heads
    ("llama", {"attention_bias": True}, "llama"),        # biases permuted with their rows
    ("mistral", {"sliding_window": None}, "llama"),      # llama.cpp runs mistral as llama
])
def test_family_gguf_greedy_equals_hf(tmp_path, family, overrides, arch):
    hf_dir = build(family, tmp_path / family, **overrides)
    check_gguf_equals_hf(hf_dir, export_gguf(hf_dir, tmp_path / "draft.gguf"), arch)


@pytest.fixture(scope="module")
def qwen2_target(tmp_path_factory):
    directory = build("qwen2", tmp_path_factory.mktemp("qwen2-target"), seed=1)
    server, port = start_verifier(TargetRuntime(directory, device="cpu"))
    yield directory, port
    server.stop(0).wait()


@pytest.mark.parametrize("draft", ["target-weights", "unrelated"])
def test_qwen2_gguf_draft_output_is_the_targets(qwen2_target, tmp_path, draft):
    target_dir, port = qwen2_target
    draft_dir = (target_dir if draft == "target-weights"
                 else build("qwen2", tmp_path / "draft", seed=7, num_hidden_layers=1))
    runtime = LlamaDraftRuntime(export_gguf(draft_dir, tmp_path / "draft.gguf"), n_ctx=256)
    reference = Reference(target_dir)
    accepted = drafted = rounds = 0
    try:
        client = client_for(channel_to(port), runtime, draft_length=4)
        for prompt in PROMPTS:
            result = client.generate(GenerationRequest(prompt, NEW_TOKENS))
            assert all(result.verified) and result.finish_reason == "length"
            assert result.token_ids == reference.greedy(prompt, NEW_TOKENS)
            accepted += sum(result.accepted_lengths)
            drafted += result.drafted_tokens
            rounds += result.rounds
    finally:
        runtime.close()
    print(f"qwen2 {draft} draft, k=4: {accepted}/{drafted} drafted tokens accepted in {rounds} rounds")
    if draft == "target-weights":
        assert accepted == drafted  # the same model on another runtime drafts the target's tokens
    else:
        assert accepted < drafted / 2  # rejections corrected, and the output is still the target's


@pytest.fixture(scope="module")
def spm_models(tmp_path_factory):
    """(target dir, draft GGUF): llama decoders over a byte-fallback SentencePiece tokenizer."""
    root = tmp_path_factory.mktemp("spm")
    tokenizer = train_bpe()
    tok_dir = save(tokenizer, root / "tokenizer")
    shape = dict(tokenizer_dir=tok_dir, vocab_size=tokenizer.get_vocab_size(), eos_id=2)
    target = build("llama", root / "target", seed=3, **shape)
    draft = build("llama", root / "draft", seed=4, num_hidden_layers=1, **shape)
    return target, export_gguf(draft, root / "draft.gguf")


def test_sentencepiece_models_stream_the_targets_text(spm_models):
    target_dir, gguf_path = spm_models
    server, port = start_verifier(TargetRuntime(target_dir, device="cpu"))
    config = EdgeConfig(
        cloud=CloudLinkConfig(address=f"127.0.0.1:{port}"),
        draft=DraftConfig(backend="llama.cpp", model_path=gguf_path, tokenizer_dir=target_dir,
                          n_ctx=256, threads=1),
        client=ClientConfig(draft_length=3),
        daemon=DaemonConfig(port=0, pool_size=1, max_tokens_limit=64, max_prompt_tokens=200))
    tokenizer, reference = EdgeTokenizer(target_dir), Reference(target_dir)
    try:
        with DaemonThread(load_pool(config)) as daemon:
            client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0,
                                   timeout=120)
            for prompt in (MULTIBYTE_TEXT, "the quick brown 🙂"):
                ids = reference.greedy(tokenizer.encode(prompt), NEW_TOKENS)
                ids = ids[:ids.index(2)] if 2 in ids else ids  # the daemon stops at </s>
                chunks = list(client.completions.create(model="tandem-draft", prompt=prompt,
                                                        max_tokens=NEW_TOKENS, temperature=0,
                                                        stream=True))
                assert "".join(c.choices[0].text for c in chunks) == tokenizer.decode(ids)
                assert chunks[-1].tandem["verified_fraction"] == 1.0  # the verifier accepted it
    finally:
        server.stop(0).wait()
