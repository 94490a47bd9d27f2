"""End-to-end numbers of the whole system: held-out prompts through a real in-process verifier
(cloud.server.create_server on 127.0.0.1, a real socket) and the edge session client, per
draft backend, greedy and sampled.

    tandem e2e-report [--prompts N] [--max-tokens 64] [--dev] [--backends ...]
                      [--draft-length 4] [--temperature 0.8] [--q-entries 16]
                      [--q-codecs entropy plain] [--json PATH]

Reported per backend and mode (metric names and formulas of shared/ANCHORS.md):
  τ                  mean accepted length = 1 + accepted / rounds (plain decoding: 1)
  passes/token       target passes (verdicts) per generated token
  up B/drafted       uplink bytes of Draft messages per drafted token (tokens + sparse q)
  q code %           time coding q (edge encode + verifier decode, tandem/qcodec.py) as a
                     share of the generations' wall time (sampled rows with q_codec entropy)
  up B/tok, down B/tok   all serialized message bytes (Open, Draft, Close / Opened, Verdict)
                     per generated token; protobuf ByteSize(), gRPC/HTTP2 framing excluded
Generation ignores eos, so every prompt yields exactly --max-tokens tokens. Sampled runs use
seed = prompt index, so a rerun gives the same numbers. Each of --q-codecs (client.q_codec:
entropy = coded q, plain = one SparseDistribution per position) runs the sampled mode over the
same prompts, so their τ compare within one run; greedy sends no q and runs once.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from cloud.config import BatchSettings, CloudConfig, ModelSettings, ServerSettings
from cloud.runtime.target import TargetRuntime
from cloud.server import create_server
from edge.client import EdgeClient
from edge.config import ClientConfig, CloudLinkConfig
from edge.link import make_channel
from edge.request import GenerationRequest
from edge.runtime import DraftConfig, MissingBackend, load_draft_runtime
from edge.tokenizer import EdgeTokenizer
from sim.writers import write_json
from tandem import metrics
from tandem.prompts import load_prompts
from tandem.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = {"draft": ROOT / "models/tandem-draft", "target": ROOT / "models/tandem-target"}
DEV = {"draft": ROOT / "models/.cache/dev-draft", "target": ROOT / "models/.cache/dev-target"}
PROMPTS = ROOT / "models/prompts/heldout.jsonl"
MODEL_FILES = {"llama.cpp": "tandem-draft-f32.gguf", "onnxruntime": "tandem-draft.onnx"}
BACKENDS = ("llama.cpp", "onnxruntime", "torch")


@dataclass
class ReportRow:
    backend: str
    mode: str                 # "greedy" or "T=0.8"
    prompts: int
    tokens: int
    rounds: int
    accepted: int
    target_passes: int
    drafted_tokens: int
    draft_bytes_up: int
    bytes_up: int
    bytes_down: int
    unverified: int
    wall_s: float
    q_encode_s: float = 0.0   # edge: coding q into Draft.q_coded
    q_decode_s: float = 0.0   # verifier: decoding it (checks included)

    @property
    def tau(self) -> float:
        return metrics.tau(self.accepted, self.rounds)

    def derived(self) -> dict:
        return {"mean_accepted_length": self.tau,
                "passes_per_token": metrics.passes_per_token(self.target_passes, self.tokens),
                "acceptance_rate": metrics.acceptance_rate(self.accepted, self.drafted_tokens),
                "uplink_bytes_per_drafted_token": self.draft_bytes_up / max(self.drafted_tokens, 1),
                "bytes_up_per_token": self.bytes_up / self.tokens,
                "bytes_down_per_token": self.bytes_down / self.tokens,
                "tokens_per_s": self.tokens / self.wall_s,
                "q_code_share": (self.q_encode_s + self.q_decode_s) / self.wall_s,
                "q_code_ms_per_round": (self.q_encode_s + self.q_decode_s) * 1000.0
                / max(self.rounds, 1)}


def report_row(backend: str, mode: str, results: list[GenerationResult],
              q_decode_s: float = 0.0) -> ReportRow:
    return ReportRow(backend=backend, mode=mode, prompts=len(results),
               tokens=sum(len(r.token_ids) for r in results),
               rounds=sum(r.rounds for r in results),
               accepted=sum(sum(r.accepted_lengths) for r in results),
               target_passes=sum(r.target_passes for r in results),
               drafted_tokens=sum(r.drafted_tokens for r in results),
               draft_bytes_up=sum(r.draft_bytes_up for r in results),
               bytes_up=sum(r.bytes_up for r in results),
               bytes_down=sum(r.bytes_down for r in results),
               unverified=sum(r.verified.count(False) for r in results),
               wall_s=sum(r.wall_s for r in results),
               q_encode_s=sum(r.q_encode_s for r in results), q_decode_s=q_decode_s)


def draft_config(backend: str, draft_dir: Path, threads: int) -> DraftConfig:
    path = draft_dir if backend == "torch" else draft_dir / MODEL_FILES[backend]
    return DraftConfig(backend=backend, model_path=path, tokenizer_dir=draft_dir, threads=threads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem e2e-report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=50, help="held-out prompts (in file order)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--draft-length", type=int, default=ClientConfig().draft_length)
    parser.add_argument("--temperature", type=float, default=0.8, help="of the sampled runs")
    parser.add_argument("--q-entries", type=int, default=ClientConfig().max_q_entries,
                        help="most ids in each sparse draft distribution (sampled runs)")
    parser.add_argument("--q-codecs", nargs="+", choices=("entropy", "plain"),
                        default=["entropy", "plain"],
                        help="client.q_codec values to compare (sampled runs)")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--dev", action="store_true",
                        help="the random development models (plumbing only; numbers mean nothing)")
    parser.add_argument("--threads", type=int, default=1, help="torch and draft CPU threads")
    parser.add_argument("--policies", nargs="+", default=[ClientConfig().policy],
                        help="draft policies to compare (client.policy names: fixed, adaptive, "
                             "...), each over the same prompts")
    parser.add_argument("--draft-ahead", action="store_true", help="pipelining: draft ahead")
    parser.add_argument("--send-ahead", type=int, default=ClientConfig().send_ahead,
                        help="pipelining: most blocks in flight")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)

    family = DEV if args.dev else SHIPPED
    torch.set_num_threads(args.threads)
    tokenizer = EdgeTokenizer(family["draft"])
    prompts = [tokenizer.encode(text) for text in load_prompts(PROMPTS, args.prompts)]
    runtime = TargetRuntime(family["target"], device="cpu")
    server, port = create_server(CloudConfig(
        server=ServerSettings(host="127.0.0.1", port=0),
        model=ModelSettings(path=family["target"], device="cpu"),
        batch=BatchSettings(window_ms=0.0)), runtime)
    server.start()
    channel = make_channel(CloudLinkConfig(), f"127.0.0.1:{port}")
    modes = {"greedy": lambda i: SamplingParams(),
             f"T={args.temperature:g}": lambda i: SamplingParams(temperature=args.temperature,
                                                                 seed=i)}
    rows: list[ReportRow] = []
    started = time.monotonic()
    try:
        for backend in args.backends:
            try:
                draft = load_draft_runtime(draft_config(backend, family["draft"], args.threads))
            except (MissingBackend, FileNotFoundError) as exc:
                print(f"skipping {backend}: {exc}", file=sys.stderr)
                continue
            try:
                for policy, codec in [(p, c) for p in args.policies for c in args.q_codecs]:
                    client = EdgeClient(channel, draft, ClientConfig(
                        draft_length=args.draft_length, max_q_entries=args.q_entries,
                        policy=policy, draft_ahead=args.draft_ahead,
                        send_ahead=args.send_ahead, q_codec=codec))
                    label = "/".join([backend] + ([policy] if len(args.policies) > 1 else [])
                                     + ([codec] if len(args.q_codecs) > 1 else []))
                    for mode, sampling in modes.items():
                        if mode == "greedy" and codec != args.q_codecs[0]:
                            continue  # greedy sends no q: the same run for every codec
                        decoded_before = server.engine.q_decode_s
                        results = [client.generate(GenerationRequest(ids, args.max_tokens,
                                                                     sampling=sampling(i)))
                                   for i, ids in enumerate(prompts)]
                        rows.append(report_row(label, mode, results,
                                              server.engine.q_decode_s - decoded_before))
                        print_row(rows[-1], header=len(rows) == 1)
            finally:
                draft.close()
    finally:
        channel.close()
        server.stop(0).wait()
    print(f"({len(prompts)} prompts x {args.max_tokens} tokens, k = {args.draft_length} (fixed), "
          f"draft-ahead {args.draft_ahead}, send-ahead {args.send_ahead}, "
          f"q entries <= {args.q_entries}, q codecs {' '.join(args.q_codecs)}, "
          f"models {'dev' if args.dev else 'shipped'}, {time.monotonic() - started:.0f} s)")
    if args.json:
        write_json(args.json, [{**asdict(row), **row.derived()} for row in rows])
    return 0


def print_row(row: ReportRow, header: bool) -> None:
    if header:
        print(f"{'backend':<20} {'mode':<7} {'τ':>5} {'passes/tok':>10} {'up B/drafted':>12} "
              f"{'up B/tok':>8} {'down B/tok':>10} {'tok/s':>7} {'unverified':>10} "
              f"{'q code %':>8}")
    d = row.derived()
    print(f"{row.backend:<20} {row.mode:<7} {d['mean_accepted_length']:5.2f} "
          f"{d['passes_per_token']:10.3f} {d['uplink_bytes_per_drafted_token']:12.1f} "
          f"{d['bytes_up_per_token']:8.1f} {d['bytes_down_per_token']:10.1f} "
          f"{d['tokens_per_s']:7.1f} {row.unverified:10d} {100 * d['q_code_share']:8.2f}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
