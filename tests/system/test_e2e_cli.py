"""`tandem-edge generate` as a user runs it (a real process against a real verifier), the link
settings (API key from the environment, TLS with a private CA), and the client's handling of
the verifier's refusals: a missing or wrong API key is an error at once, never a silent
fall-back to unverified local tokens."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import torch
import yaml
from verifier_harness import channel_to, client_for, open_draft, start_verifier
from verifier_harness import (edge_tokenizer, prompt_ids, reference,  # noqa: F401 (fixtures)
                              target_runtime)

from edge.cli import main
from edge.request import GenerationRequest
from edge.link.errors import VerifierRefused
from edge.config import CloudLinkConfig
from edge.link import call_metadata, make_channel

pytestmark = pytest.mark.e2e  # real verifier, daemon or processes end to end

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key-7c1f"


@pytest.fixture(scope="module")
def keyed_verifier(target_runtime):
    server, port = start_verifier(target_runtime, api_keys=(KEY,))
    yield port
    server.stop(0).wait()


def write_config(tmp_path: Path, draft_dir: Path, gguf_path: Path, port: int) -> Path:
    config = tmp_path / "edge.yaml"
    config.write_text(
        f"cloud:\n  address: 127.0.0.1:{port}\n  api_key_env: ''\n"
        f"draft:\n  backend: llama.cpp\n  model_path: {gguf_path}\n  tokenizer_dir: {draft_dir}\n"
        f"  threads: 1\nclient:\n  draft_length: 3\n  offline_after_s: 1.0\n")
    return config


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)


def test_generate_json_is_the_targets_greedy_output(tmp_path, keyed_verifier, heldout_prompts,
                                                    prompt_ids, edge_tokenizer, reference,
                                                    draft_dir, gguf_path):
    config = write_config(tmp_path, draft_dir, gguf_path, keyed_verifier)
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(heldout_prompts[160])
    done = run_cli("generate", "--config", str(config), "--prompt-file", str(prompt_file),
                   "--max-tokens", "24", "--api-key", KEY, "--ignore-eos", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for field in ("text", "token_ids", "rounds", "accepted_lengths", "target_passes", "bytes_up",
                  "bytes_down", "verified", "wall_s"):
        assert field in out
    expected = reference.greedy(prompt_ids[160], 64)[:24]
    assert out["token_ids"] == expected
    assert out["text"] == edge_tokenizer.decode(expected)
    assert out["verified"] == [True] * 24
    assert out["rounds"] == len(out["accepted_lengths"]) == out["target_passes"]
    assert out["bytes_up"] > 0 and out["bytes_down"] > 0


def test_generate_human_output_and_a_refused_key(tmp_path, keyed_verifier, draft_dir, gguf_path,
                                                 capsys):
    config = write_config(tmp_path, draft_dir, gguf_path, keyed_verifier)
    code = main(["generate", "--config", str(config), "--prompt", "def f(x):\n",
                 "--max-tokens", "8", "--temperature", "0.8", "--seed", "3", "--api-key", KEY,
                 "--ignore-eos"])  # a sample may well be eos at once; the stats line is the point
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.strip() and "8 tokens" in out.err and "rounds" in out.err and "τ" in out.err
    code = main(["generate", "--config", str(config), "--prompt", "def f(x):\n",
                 "--max-tokens", "8", "--api-key", "wrong"])
    assert code == 1
    assert "PERMISSION_DENIED" in capsys.readouterr().err


def test_draft_length_flag_runs_that_fixed_k_under_the_shipped_adaptive_policy(
        tmp_path, keyed_verifier, heldout_prompts, draft_dir, gguf_path, capsys):
    shipped_policy = yaml.safe_load((ROOT / "configs/edge.yaml").read_text())["client"]["policy"]
    config = write_config(tmp_path, draft_dir, gguf_path, keyed_verifier)
    config.write_text(config.read_text() + f"  policy: {shipped_policy}\n")

    def generate(*flags: str) -> dict:
        code = main(["generate", "--config", str(config), "--prompt", heldout_prompts[163],
                     "--max-tokens", "48", "--api-key", KEY, "--ignore-eos", "--json", *flags])
        out = capsys.readouterr()
        assert code == 0, out.err
        return json.loads(out.out)

    fixed, adaptive = generate("--draft-length", "8"), generate()
    # Every round asks for 8, but those near the end: one less than the tokens still to come
    # (the verdict adds one of its own).
    committed = 0
    for record in fixed["rounds_log"]:
        assert record["mode"] == "verify" and record["k_asked"] == min(8, 48 - committed - 1)
        committed += record["committed"]
    assert len(fixed["token_ids"]) == 48 and all(fixed["verified"])
    assert fixed["target_passes"] < adaptive["target_passes"], (fixed["target_passes"],
                                                                adaptive["target_passes"])


def test_missing_api_key_is_refused_not_taken_offline(keyed_verifier, prompt_ids, draft_dir,
                                                      gguf_path, onnx_path):
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        client = client_for(channel_to(keyed_verifier), draft)
        with pytest.raises(VerifierRefused) as refused:
            client.generate(GenerationRequest(prompt_ids[161], 8))
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        keyed = client_for(channel_to(keyed_verifier), draft, metadata=(("x-api-key", KEY),))
        result = keyed.generate(GenerationRequest(prompt_ids[161], 8))
    finally:
        draft.close()
    assert all(result.verified) and len(result.token_ids) == 8


def test_a_bad_config_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "edge.yaml"
    bad.write_text("client:\n  draft_length: -1\n")
    assert main(["generate", "--config", str(bad), "--prompt", "x", "--max-tokens", "4"]) == 2
    assert "draft_length" in capsys.readouterr().err


def test_tls_link_with_the_api_key_from_the_environment(tmp_path, monkeypatch, target_runtime,
                                                        prompt_ids, reference, draft_dir,
                                                        gguf_path, onnx_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60)
    monkeypatch.setenv("TANDEM_TEST_EDGE_KEY", KEY)
    server, port = start_verifier(target_runtime, api_keys=(KEY,), tls=(cert, key))
    link = CloudLinkConfig(address=f"127.0.0.1:{port}", tls=True, tls_root_cert=cert,
                           api_key_env="TANDEM_TEST_EDGE_KEY")
    draft = open_draft("llama.cpp", draft_dir, gguf_path, onnx_path)
    try:
        assert call_metadata(link) == (("x-api-key", KEY),)
        client = client_for(make_channel(link), draft, metadata=call_metadata(link))
        result = client.generate(GenerationRequest(prompt_ids[162], 8))
    finally:
        server.stop(0).wait()
        draft.close()
    assert all(result.verified)
    assert result.token_ids == reference.greedy(prompt_ids[162], 64)[:8]
