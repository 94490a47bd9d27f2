"""Fast mode as a user gets it: `python -m bench.fast_mode [--prompts 16] [--max-tokens 64]`.

The shipped configs/edge.yaml (whatever its client.policy) in an edge daemon on loopback, in
front of a verifier with the shipped configs/cloud.yaml; held-out code prompts sent with
`"mode": "fast"`, greedy. Prints the share of tokens the target verified and the teacher-forced
agreement: the share of emitted tokens equal to the target's greedy choice after the same
emitted prefix (one target pass over prompt + output).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM

from bench.workload import load_prompts
from cloud.config import CloudConfig
from cloud.service import create_server
from edge.config import EdgeConfig, resolve_paths
from edge.daemon.server import DaemonThread, load_engine
from tandem.config import load_config, resolve_path

PROMPTS = Path("models/prompts/heldout.jsonl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fast_mode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-offset", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--edge-config", type=Path, default=Path("configs/edge.yaml"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cloud = load_config(resolve_path(Path("configs/cloud.yaml")), CloudConfig,
                        {"server": {"host": "127.0.0.1", "port": 0}})
    target = AutoModelForCausalLM.from_pretrained(resolve_path(cloud.model.path),
                                                  dtype=torch.float32).eval()
    server, port = create_server(cloud)
    server.start()
    edge = resolve_paths(load_config(resolve_path(args.edge_config), EdgeConfig, {
        "cloud": {"address": f"127.0.0.1:{port}"},
        "daemon": {"host": "127.0.0.1", "port": 0, "pool_size": 1}}))
    verified = emitted = agree = 0
    try:
        with DaemonThread(load_engine(edge)) as daemon, httpx.Client(timeout=120) as http:
            for prompt in load_prompts(resolve_path(PROMPTS), args.prompts, args.prompt_offset,
                                       2000):
                ids = http.post(daemon.url + "/tokenize", json={"prompt": prompt}).json()["tokens"]
                reply = http.post(daemon.url + "/v1/completions", json={
                    "model": edge.daemon.model_name, "prompt": ids[-400:], "temperature": 0,
                    "max_tokens": args.max_tokens, "ignore_eos": True, "mode": "fast",
                    "return_token_ids": True}).json()
                out, stats = reply["choices"][0]["token_ids"], reply["tandem"]
                verified += stats["verified_tokens"]
                emitted += stats["verified_tokens"] + stats["unverified_tokens"]
                context = ids[-400:]
                with torch.inference_mode():
                    greedy = target(torch.tensor([context + out])).logits[0].argmax(-1).tolist()
                agree += sum(t == greedy[len(context) + i - 1] for i, t in enumerate(out))
    finally:
        server.stop(0).wait()
    print(f"fast mode, {args.edge_config}: {verified / emitted:.1%} of {emitted} tokens verified, "
          f"teacher-forced agreement with the target {agree / emitted:.1%} "
          f"({args.prompts} held-out prompts x {args.max_tokens} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
