"""The edge model ladder and fast mode, measured (issue 11): `tandem ladder`.

    tandem ladder [--prompts 3] [--max-tokens 32] [--channels lan lte]
                  [--devices laptop phone] [--min-agreements 0.9 0.95 0.97]
                  [--sources code prose] [--fast-prompts 8] [--max-unverified-run 16]
                  [--json PATH] [--plot PATH] [--markdown]

One in-process verifier (cloud.server on 127.0.0.1, the shipped target), a link emulator in
front of it per channel profile (sim.netem.ChannelProxy), and the edge's two local models
(tandem-draft and tandem-small, llama.cpp, one thread) throttled per device profile like
`tandem bench` does (bench/matrix/device.py). Greedy, eos ignored, the same held-out prompts for
every configuration.

Lossless (every token verified; output must equal the target's own greedy output, checked):
  draft   fixed k = client.draft_length with tandem-draft alone
  small   the same with tandem-small alone
  switch  the entropy switch (edge/control/entropy.py) over the ladder [draft, small]
  -> tokens/s and joules per token per (channel, device); speed-up of `switch` over the better
     single drafter. Energy: bench.matrix.device.joules per model, the draft-token cost of
     tandem-small scaled by its parameter count relative to tandem-draft (a phone's energy per
     token grows with the weights it reads).

Fast mode (mode fast held to a stated agreement, edge/fast_mode.py; one channel and device):
per prompt source (tandem/prompts.py: held-out code, and prose from the held-out files'
docstrings and comments; the eval files, which the calibration prior was not fitted on) and per
min_agreement A (a fresh client each: its calibration starts from the shipped prior and learns
over the sources in turn):
  verified share   tokens the target checked / tokens emitted
  agreement        share of emitted tokens equal to the target's greedy choice after the same
                   emitted prefix (teacher-forced: one target pass over prompt + output)
  predicted        the calibration's expected agreement (GenerationResult.agreement), beside it
  mean log-lik     mean log p_target(token | emitted prefix) over the output
  uplink B/token   every serialized message sent / tokens emitted
  longest run      longest unverified run seen (must be <= --max-unverified-run)
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from bench.matrix.config import BenchConfig, DeviceSpec, load_device
from bench.matrix.device import ThrottledDraft, joules
from bench.matrix.oracle import target_greedy
from cloud.config import CloudConfig
from cloud.runtime.target import TargetRuntime
from cloud.server import create_server
from edge.client import EdgeClient
from edge.request import GenerationRequest
from edge.config import DEFAULT_DRAFTER, ClientConfig, EdgeConfig, resolve_paths
from edge.link import make_channel
from edge.record import GenerationResult
from edge.runtime import DraftConfig, load_draft_runtime
from edge.runtime.base import DraftRuntime
from edge.tokenizer import EdgeTokenizer
from sim.netem import ChannelProfile, ChannelProxy
from sim.netem.profile import load_profile
from sim.writers import pyplot, save_figure, write_json
from tandem.config import load_config, merge, resolve_path
from tandem.prompts import SOURCES, load_prompts, load_source

ROOT = Path(__file__).resolve().parents[1]
SMALL = "small"
LOSSLESS_CONFIGS = ("draft", "small", "switch")
FAST_CONTEXT_TOKENS = 400  # a fast prompt's last tokens, as bench.fast_mode_bench sends them


@dataclass
class LosslessRow:
    channel: str
    device: str
    config: str
    tokens: int
    wall_s: float
    tokens_per_s: float
    joules_per_token: float
    tau: float
    identical: bool            # output == the target's greedy output, every prompt
    small_share: float         # share of drafted tokens drafted by tandem-small


@dataclass
class FastRow:
    source: str
    min_agreement: float
    tokens: int
    verified_share: float
    agreement: float
    predicted: float           # the calibration's expected agreement, token-weighted
    mean_loglik: float
    uplink_bytes_per_token: float
    tokens_per_s: float
    longest_unverified_run: int


def params(model_dir: Path) -> int:
    """Parameter count of an HF directory, from its safetensors header."""
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())


def load_ladder(edge: EdgeConfig, small_dir: Path, threads: int) -> dict[str, DraftRuntime]:
    base = edge.draft.model_copy(update={"threads": threads})
    small = DraftConfig(backend=base.backend, model_path=small_dir / f"{small_dir.name}-f32.gguf"
                        if base.backend == "llama.cpp" else small_dir, n_ctx=base.n_ctx,
                        threads=threads)
    return {DEFAULT_DRAFTER: load_draft_runtime(base), SMALL: load_draft_runtime(small)}


def throttled(ladder: Mapping[str, DraftRuntime], device: DeviceSpec,
              cost: Mapping[str, float]) -> dict[str, DraftRuntime]:
    """Each rung slowed to the device's speed divided by its relative cost."""
    if not (device.draft_tokens_per_s or device.prefill_tokens_per_s):
        return dict(ladder)
    return {name: ThrottledDraft(rt, device.draft_tokens_per_s / cost[name],
                                 device.prefill_tokens_per_s / cost[name])
            for name, rt in ladder.items()}


def energy(result: GenerationResult, device: DeviceSpec, cost: Mapping[str, float]) -> float:
    """Joules: each rung's drafted tokens at its cost, plus the radio's bytes."""
    by_model: dict[str, int] = {}
    for r in result.rounds_log:
        by_model[r.drafter or DEFAULT_DRAFTER] = by_model.get(r.drafter or DEFAULT_DRAFTER, 0) + r.drafted
    radio = joules(device.profile, 0, result.bytes_up, result.bytes_down)
    return radio + sum(n * device.profile.joules_per_draft_token * cost[m] for m, n in by_model.items())


def lossless_client(base: ClientConfig, name: str) -> ClientConfig:
    if name == "switch":
        return base.model_copy(update={"policy": "entropy", "mode": "lossless"})
    return base.model_copy(update={"policy": "fixed", "mode": "lossless"})


def fast_client(base: ClientConfig, max_run: int) -> ClientConfig:
    return base.model_copy(update={"policy": "entropy", "mode": "fast",
                                   "max_unverified_run": max_run})


def longest_false_run(flags: Sequence[bool]) -> int:
    best = run = 0
    for flag in flags:
        run = 0 if flag else run + 1
        best = max(best, run)
    return best


@torch.inference_mode()
def teacher_forced(target: TargetRuntime, prompt: Sequence[int], output: Sequence[int]) -> tuple[int, float]:
    """(tokens equal to the target's greedy choice after the same prefix, sum of log-likelihoods)."""
    state = target.new_state()
    logits = target.score(state, list(prompt) + list(output[:-1]))[len(prompt) - 1:]  # [len(output), V]
    logp = torch.log_softmax(logits.float(), dim=-1)
    out = torch.tensor(output)
    agree = int((logits.argmax(-1) == out).sum())
    return agree, float(logp.gather(1, out[:, None]).sum())


def run(args: argparse.Namespace) -> dict:
    bench = BenchConfig()
    edge = resolve_paths(load_config(resolve_path(bench.edge_config), EdgeConfig))
    cloud = load_config(resolve_path(bench.cloud_config), CloudConfig,
                        merge(bench.cloud_overrides, {"server": {"host": "127.0.0.1", "port": 0}}))
    small_dir = resolve_path(args.small)
    cost = {DEFAULT_DRAFTER: 1.0, SMALL: params(small_dir) / params(edge.draft.resolved_tokenizer_dir)}
    tokenizer = EdgeTokenizer(edge.draft.resolved_tokenizer_dir)
    texts = load_prompts(resolve_path(bench.prompts_file), args.prompts + 1, args.prompt_offset,
                         bench.max_prompt_chars)
    prompts = [tokenizer.encode(t) for t in texts]
    warmup, prompts = prompts[-1], prompts[:-1]
    sources = {s: [tokenizer.encode(t)[-FAST_CONTEXT_TOKENS:] for t in
                   load_source(resolve_path(SOURCES[s]), "eval", args.fast_prompts)]
               for s in args.sources}
    target = TargetRuntime(resolve_path(cloud.model.path), device=cloud.model.device,
                           dtype=cloud.model.dtype)
    references = [target_greedy(target, p, args.max_tokens) for p in prompts]
    ladder = load_ladder(edge, small_dir, args.threads)
    server, port = create_server(cloud, target)
    server.start()
    lossless: list[LosslessRow] = []
    fast: list[FastRow] = []
    started = time.monotonic()
    try:
        devices = [load_device(bench, d) for d in args.devices]
        channels = [load_profile(resolve_path(Path("configs/channels") / f"{c}.yaml"))
                    for c in args.channels]
        for device in devices:
            rungs = throttled(ladder, device, cost)
            for profile in channels:
                lossless += _lossless(edge, device, profile, port, rungs, cost, prompts,
                                      references, warmup, args)
        fast = _fast(edge, devices[0], channels[0], port, throttled(ladder, devices[0], cost),
                     target, sources, args)
    finally:
        server.stop(0).wait(30)
        for rt in ladder.values():
            rt.close()
    return {"lossless": [asdict(r) for r in lossless], "fast": [asdict(r) for r in fast],
            "speedup": speedups(lossless), "goal_fast": fast_goal(fast),
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "small_cost": cost[SMALL], "elapsed_s": time.monotonic() - started}


def _generate(client: EdgeClient, ladder: Mapping[str, DraftRuntime], prompt: list[int],
              max_tokens: int, **kw) -> GenerationResult:
    for rt in ladder.values():
        rt.rollback(0)  # every cursor re-syncs from scratch: no cache carried between configs
    return client.generate(GenerationRequest(prompt, max_tokens, **kw))


def _client(channel, ladder: Mapping[str, DraftRuntime], config: ClientConfig,
            only: str | None = None) -> EdgeClient:
    if only is not None:
        return EdgeClient(channel, ladder[only], config)
    others = {n: rt for n, rt in ladder.items() if n != DEFAULT_DRAFTER}
    return EdgeClient(channel, ladder[DEFAULT_DRAFTER], config, drafters=others)


def _lossless(edge: EdgeConfig, device: DeviceSpec, profile: ChannelProfile, port: int,
              ladder: Mapping[str, DraftRuntime], cost: Mapping[str, float],
              prompts: list[list[int]], references: list[list[int]], warmup: list[int],
              args: argparse.Namespace) -> list[LosslessRow]:
    rows = []
    with ChannelProxy(profile, upstream=("127.0.0.1", port)) as proxy:
        host, proxy_port = proxy.address
        channel = make_channel(edge.cloud, f"{host}:{proxy_port}")
        try:
            clients = {name: _client(channel, ladder, lossless_client(edge.client, name),
                                     only=None if name == "switch" else
                                     (DEFAULT_DRAFTER if name == "draft" else SMALL))
                       for name in LOSSLESS_CONFIGS}
            for client in clients.values():
                _generate(client, ladder, warmup, 8)
            results: dict[str, list[GenerationResult]] = {n: [] for n in LOSSLESS_CONFIGS}
            identical = {n: True for n in LOSSLESS_CONFIGS}
            # Prompt-major order: a drift of the shared machine's load hits every config alike.
            for prompt, reference in zip(prompts, references):
                for name, client in clients.items():
                    res = _generate(client, ladder, prompt, args.max_tokens)
                    results[name].append(res)
                    identical[name] &= res.token_ids == reference
            for name, rs in results.items():
                tokens = sum(len(r.token_ids) for r in rs)
                wall = sum(r.wall_s for r in rs)
                drafted = sum(rr.drafted for r in rs for rr in r.rounds_log)
                small = sum(rr.drafted for r in rs for rr in r.rounds_log if rr.drafter == SMALL)
                if name == "small":
                    small = drafted
                accepted = sum(sum(r.accepted_lengths) for r in rs)
                rounds = sum(r.rounds for r in rs)
                jl = sum(energy(r, device, {DEFAULT_DRAFTER: cost[SMALL] if name == "small" else 1.0,
                                            SMALL: cost[SMALL]}) for r in rs)
                rows.append(LosslessRow(
                    channel=profile.name, device=device.name, config=name, tokens=tokens,
                    wall_s=wall, tokens_per_s=tokens / wall if wall else 0.0,
                    joules_per_token=jl / tokens if tokens else 0.0,
                    tau=1 + accepted / rounds if rounds else 1.0, identical=identical[name],
                    small_share=small / drafted if drafted else 0.0))
        finally:
            channel.close()
    return rows


def _fast(edge: EdgeConfig, device: DeviceSpec, profile: ChannelProfile, port: int,
          ladder: Mapping[str, DraftRuntime], target: TargetRuntime,
          sources: Mapping[str, list[list[int]]], args: argparse.Namespace) -> list[FastRow]:
    rows = []
    with ChannelProxy(profile, upstream=("127.0.0.1", port)) as proxy:
        host, proxy_port = proxy.address
        channel = make_channel(edge.cloud, f"{host}:{proxy_port}")
        try:
            for a in args.min_agreements:
                # a fresh client: its calibration starts from the shipped prior
                client = _client(channel, ladder, fast_client(edge.client, args.max_unverified_run))
                for source, prompts in sources.items():
                    tokens = verified = agree = up = 0
                    loglik = wall = predicted = 0.0
                    longest = 0
                    for prompt in prompts:
                        res = _generate(client, ladder, prompt, args.max_tokens, mode="fast",
                                        min_agreement=a)
                        n = len(res.token_ids)
                        good, ll = teacher_forced(target, prompt, res.token_ids)
                        tokens += n
                        verified += sum(res.verified)
                        agree += good
                        predicted += res.agreement["expected_agreement"] * n
                        loglik += ll
                        up += res.bytes_up
                        wall += res.wall_s
                        longest = max(longest, longest_false_run(res.verified))
                    rows.append(FastRow(
                        source=source, min_agreement=a, tokens=tokens,
                        verified_share=verified / tokens, agreement=agree / tokens,
                        predicted=predicted / tokens, mean_loglik=loglik / tokens,
                        uplink_bytes_per_token=up / tokens, tokens_per_s=tokens / wall,
                        longest_unverified_run=longest))
        finally:
            channel.close()
    return rows


def speedups(rows: Sequence[LosslessRow]) -> dict:
    """Per (channel, device): switch tokens/s over the better single drafter; and the mean."""
    out: dict[str, float] = {}
    for row in rows:
        if row.config != "switch":
            continue
        singles = [r.tokens_per_s for r in rows if r.channel == row.channel and
                   r.device == row.device and r.config in ("draft", "small")]
        out[f"{row.channel}/{row.device}"] = row.tokens_per_s / max(singles) if singles else 0.0
    mean = sum(out.values()) / len(out) if out else 0.0
    return {"per_profile": out, "mean": mean, "goal": 1.1, "met": mean >= 1.1}


def fast_goal(rows: Sequence[FastRow]) -> dict:
    """Issue 30's goals, at min_agreement 0.95 (the shipped default) on every source: agreement
    >= 95% with <= 40% of tokens verified, and the predicted agreement within 2 points of the
    measured one. The largest gap over every point is reported beside it."""
    at = [r for r in rows if abs(r.min_agreement - 0.95) < 1e-9]
    gap = max((abs(r.predicted - r.agreement) for r in at), default=None)
    return {"verified_share": {r.source: r.verified_share for r in at},
            "agreement": {r.source: r.agreement for r in at},
            "prediction_gap": gap, "goal_verified": 0.40, "goal_gap": 0.02,
            "max_prediction_gap_any": max((abs(r.predicted - r.agreement) for r in rows),
                                          default=None),
            "met": bool(at) and all(r.agreement >= 0.95 and r.verified_share <= 0.40
                                    for r in at) and gap is not None and gap <= 0.02}


def markdown(report: dict) -> str:
    lines = ["| channel | device | config | tok/s | J/token | τ | small share | identical |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["lossless"]:
        lines.append(f"| {r['channel']} | {r['device']} | {r['config']} | {r['tokens_per_s']:.1f} | "
                     f"{r['joules_per_token']:.4f} | {r['tau']:.2f} | {r['small_share']:.2f} | "
                     f"{'yes' if r['identical'] else 'NO'} |")
    s = report["speedup"]
    lines += ["", "switch ÷ better single drafter: " + ", ".join(
        f"{k} {v:.2f}×" for k, v in s["per_profile"].items()) + f"; mean {s['mean']:.2f}× "
        f"(goal ≥ 1.1×: {'met' if s['met'] else 'not met'})", "",
        "| source | min_agreement | verified share | agreement | predicted | mean log-lik | "
        "uplink B/token | tok/s | longest unverified run |",
        "|---|---|---|---|---|---|---|---|---|"]
    for r in report["fast"]:
        lines.append(f"| {r['source']} | {r['min_agreement']:.2f} | {r['verified_share']:.3f} | "
                     f"{r['agreement']:.3f} | {r['predicted']:.3f} | {r['mean_loglik']:.3f} | "
                     f"{r['uplink_bytes_per_token']:.1f} | {r['tokens_per_s']:.1f} | "
                     f"{r['longest_unverified_run']} |")
    g = report["goal_fast"]
    def points(gap: float | None) -> str:
        return "n/a" if gap is None else f"{gap * 100:.1f} points"

    lines += ["", "fast goal (min_agreement 0.95, every source: agreement >= 95 % with <= 40 % "
              "verified, predicted within 2 points): verified " + ", ".join(
                  f"{s} {v:.1%}" for s, v in g["verified_share"].items()) + ", agreement " +
              ", ".join(f"{s} {v:.1%}" for s, v in g["agreement"].items()) +
              f", prediction gap {points(g['prediction_gap'])} — "
              f"{'met' if g['met'] else 'not met'} (largest gap at any min_agreement: "
              f"{points(g['max_prediction_gap_any'])})"]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    rows = report["fast"]
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for source in sorted({r["source"] for r in rows}):
        line = sorted((r for r in rows if r["source"] == source), key=lambda r: r["min_agreement"])
        drawn = ax.plot([r["verified_share"] for r in line], [r["agreement"] for r in line], "o-",
                        label=f"{source}: teacher-forced")
        ax.plot([r["verified_share"] for r in line], [r["predicted"] for r in line], "x--",
                color=drawn[0].get_color(), label=f"{source}: predicted")
        for r in line:
            ax.annotate(f"A={r['min_agreement']:g}", (r["verified_share"], r["agreement"]),
                        fontsize=8)
    ax.axhline(0.95, color="grey", ls="--", lw=0.8)
    ax.axvline(0.40, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("share of tokens the cloud verified")
    ax.set_ylabel("agreement with the target")
    ax.set_title("fast mode held to min_agreement A")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem ladder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=3, help="held-out prompts per configuration")
    parser.add_argument("--prompt-offset", type=int, default=0, help="index of the first prompt")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per generation (eos ignored)")
    parser.add_argument("--channels", nargs="+", default=["lan", "lte"],
                        help="channel profiles (configs/channels/NAME.yaml)")
    parser.add_argument("--devices", nargs="+", default=["laptop", "phone"],
                        help="device profiles (configs/devices/NAME.yaml)")
    parser.add_argument("--min-agreements", type=float, nargs="+", default=[0.9, 0.95, 0.97],
                        help="fast mode: the requests' min_agreement, one point of the curve each")
    parser.add_argument("--sources", nargs="+", default=list(SOURCES), choices=list(SOURCES),
                        help="fast mode: prompt sources (tandem/prompts.py, eval files)")
    parser.add_argument("--fast-prompts", type=int, default=16,
                        help="fast mode: prompts per source")
    parser.add_argument("--max-unverified-run", type=int, default=16,
                        help="fast mode: the requests' bound on unverified runs")
    parser.add_argument("--small", type=Path, default=Path("models/tandem-small"),
                        help="the small model's HF directory (its GGUF beside it)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per local model")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--plot", type=Path, help="write the fast-mode curve (PNG) here")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, report)
    if args.plot:
        plot(report, args.plot)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
