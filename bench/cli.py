"""`tandem`: the benchmark harness's command line.

  tandem sim [--config configs/sim.yaml] [--json PATH] [--plots DIR]
      verifier + one channel emulator per profile + edge daemon on loopback, the held-out
      workload through the daemon's HTTP API, a table per profile, JSON and PNG plots
  tandem loadgen --url http://HOST:8080 --requests N [--concurrency C]
      the same workload against a running daemon (docker-compose's loadgen service)
  tandem load --streams N --duration S [--max-tokens T] [--verifiers V]
      N concurrent streams through a daemon against V verifiers (all started as processes):
      tokens/s total and per stream, p50/p99 TTFT and TPOT, verifier batch sizes, peak RSS
  tandem bench [--config configs/bench.yaml] [--channel FILE.yaml ...] [--device NAME ...]
               [--json PATH] [--plots DIR] [--prompts N] [--offsets N|S,S] [--max-tokens M]
               [--held-out-trace PATH ...]
      every configuration (cloud-only, edge-only, fixed k, peers' rules, adaptive, oracle) per
      channel and device profile, paired per (prompt, trace offset): table, goal ratios with
      95% bootstrap intervals and verdicts, JSON and PNG plots (bench/matrix/)
  tandem capacity ...        users one verifier serves at a latency SLO (bench/capacity/)
  tandem ladder ...          the edge model ladder and the fast-mode curve (bench/ladder.py)
  tandem pass-cost ...       a target's verify-pass time surface (bench/passcost/)
  tandem verifier-bench ...  verifier goodput: torch vs vLLM vs target-only (bench/verifier.py)
  tandem fast-mode-bench ... fast mode's verified share and agreement (bench/fast_mode.py)
  tandem startup-race ...    verifier and daemon started together under load (bench/startup_race.py)
  tandem failover ...        a verifier killed under load behind the daemon (bench/failover.py)
  tandem runtime-bench ...   tokens/s of each draft backend and the target (bench/runtimes.py)
  tandem e2e-report ...      accepted length, passes and bytes per token (bench/e2e_report.py)
  tandem channel ...         the channel emulator as a standalone TCP proxy (bench/channel/)
Each has its own options: `tandem VERB -h`.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
import time
from pathlib import Path

from bench.matrix.cli import add_parser as add_bench_parser
from bench.capacity.cli import add_parser as add_capacity_parser
from tandem.cli import add_version, fail
from tandem.config import ConfigError, command_line, load_config, resolve_path

DEFAULT_OUT = Path("out/sim")

# Benchmarks and tools with their own argument parser (options and -h are theirs, prog
# "tandem VERB"): verb -> (module whose main(argv) runs it, one line for `tandem -h`). Their
# modules import torch / grpc, so each loads only when its verb runs.
OWN_PARSER_VERBS = {
    "ladder": ("bench.ladder", "the edge model ladder and fast mode: switching vs each local "
                               "model alone, fast-mode curve"),
    "pass-cost": ("bench.passcost.cli", "a target's verify-pass time surface on this device: "
                                        "sessions x tokens x context, KV memory bound"),
    "verifier-bench": ("bench.verifier", "verifier goodput and round latency: torch vs vLLM "
                                         "backend vs target-only decoding"),
    "fast-mode-bench": ("bench.fast_mode", "fast mode over min_agreement: verified share, "
                                           "agreement with the target, per prompt source"),
    "startup-race": ("bench.startup_race", "verifier and daemon started together under a "
                                           "burst of requests: what the first ones get"),
    "failover": ("bench.failover", "several verifiers behind the daemon, one killed under "
                                   "load: failed requests, re-opens, tokens/s"),
    "runtime-bench": ("bench.runtimes", "prefill and decode tokens/s of each draft backend "
                                        "and the target"),
    "e2e-report": ("bench.e2e_report", "accepted length, passes and bytes per token on "
                                       "held-out prompts, greedy and sampled"),
    "channel": ("bench.channel.__main__", "the channel emulator as a standalone TCP proxy"),
}


def sim_config(args: argparse.Namespace):
    """`tandem sim`'s SimConfig: defaults < config file < environment < --set < named flags."""
    from bench.sim_config import SimConfig

    flags = {"prompts": args.prompts, "max_tokens": args.max_tokens, "concurrency": args.concurrency,
             "profiles": args.profiles.split(",") if args.profiles else None}
    return load_config(args.config, SimConfig, command_line(args.set, flags),
                       env_prefix="TANDEM_SIM_")


def _sim(args: argparse.Namespace) -> int:
    config = sim_config(args)
    from bench.sim import print_report, run_sim  # loads torch / grpc only when simulating

    json_path = args.json if args.json is not None else DEFAULT_OUT / "sim.json"
    plots_dir = args.plots if args.plots is not None else DEFAULT_OUT
    result = run_sim(config, json_path=json_path, plots_dir=plots_dir, progress=not args.no_progress)
    print_report(result)
    return 1 if any(s.errors for s in result.summaries) else 0


def _loadgen(args: argparse.Namespace) -> int:
    from bench.report import format_table, summarize, write_json
    from bench.workload import advertised_model, load_prompts, run_workload

    model = args.model or advertised_model(args.url, api_key=args.api_key)
    prompts = load_prompts(resolve_path(args.prompts_file), args.requests, args.offset)
    t0 = time.monotonic()
    records = asyncio.run(run_workload(args.url, model, prompts, max_tokens=args.max_tokens,
                                       concurrency=args.concurrency, temperature=args.temperature,
                                       timeout_s=args.timeout, trace=False,
                                       api_key=args.api_key))
    summary = summarize("run", records, time.monotonic() - t0)
    print(format_table([summary]))
    for record in records:
        if not record.ok:
            print(f"request {record.index} failed: {record.error}", file=sys.stderr)
    if args.json is not None:
        write_json(args.json, [summary], {"run": records}, {"url": args.url, "model": model})
    return 1 if summary.errors else 0


def _load(args: argparse.Namespace) -> int:
    from bench.load import run_load, write_report

    pids = {}
    for item in args.pid:
        name, _, pid = item.partition("=")
        pids[name] = int(pid)
    report, _ = run_load(streams=args.streams, duration_s=args.duration,
                         max_tokens=args.max_tokens, temperature=args.temperature,
                         prompts_file=resolve_path(args.prompts_file), prompt_offset=args.offset,
                         url=args.url, cloud=args.cloud, pids=pids, log_dir=args.log_dir,
                         cloud_args=args.cloud_arg, edge_args=args.edge_arg,
                         verifiers=args.verifiers)
    print(report.table())
    for error in report.first_errors:
        print(f"error: {error}", file=sys.stderr)
    if args.json is not None:
        write_report(args.json, report)
    errors = report.errors
    if args.compare_cloud_only:
        from bench.load import server_table
        alone, _ = run_load(streams=args.streams, duration_s=args.duration,
                            max_tokens=args.max_tokens, temperature=args.temperature,
                            prompts_file=resolve_path(args.prompts_file),
                            prompt_offset=args.offset, log_dir=args.log_dir / "cloud-only",
                            cloud_args=args.cloud_arg, verifiers=args.verifiers,
                            edge_args=[*args.edge_arg, "--set", "client.draft_length=0"])
        print("cloud-only (k = 0 rounds: the target decoding alone, same streams):")
        print(alone.table())
        print(server_table(report, alone))
        if args.json is not None:
            write_report(args.json.with_name(args.json.stem + "-cloud-only.json"), alone)
        errors += alone.errors
    return 1 if errors else 0


def _own_parser(verb: str, options: list[str]) -> int:
    module, _ = OWN_PARSER_VERBS[verb]
    status = importlib.import_module(module).main(options)
    return 0 if status is None else status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("sim", help="run the loopback simulation over the channel profiles")
    sim.add_argument("--config", type=Path, default=Path("configs/sim.yaml"))
    sim.add_argument("--json", type=Path, default=None, help=f"results file (default {DEFAULT_OUT}/sim.json)")
    sim.add_argument("--plots", type=Path, default=None, help=f"PNG directory (default {DEFAULT_OUT})")
    sim.add_argument("--profiles", default=None, help="comma-separated subset, e.g. lan,lte")
    sim.add_argument("--prompts", type=int, default=None, help="override prompts per profile")
    sim.add_argument("--max-tokens", type=int, default=None, help="override tokens per request")
    sim.add_argument("--concurrency", type=int, default=None, help="override requests in flight")
    sim.add_argument("--no-progress", action="store_true", help="no progress bar")
    sim.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                     help="override any sim config key (repeatable; VALUE is read as YAML); "
                          "environment: TANDEM_SIM_<KEY>")
    sim.set_defaults(run=_sim)

    load = sub.add_parser("loadgen", help="send the held-out workload to a running daemon")
    load.add_argument("--url", required=True, help="daemon base URL, e.g. http://127.0.0.1:8080")
    load.add_argument("--requests", type=int, default=16)
    load.add_argument("--concurrency", type=int, default=4)
    load.add_argument("--max-tokens", type=int, default=64)
    load.add_argument("--temperature", type=float, default=0.0)
    load.add_argument("--model", default=None, help="model id (default: the first one the daemon lists)")
    load.add_argument("--prompts-file", type=Path, default=Path("models/prompts/heldout.jsonl"))
    load.add_argument("--offset", type=int, default=0, help="index of the first prompt")
    load.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    load.add_argument("--json", type=Path, default=None)
    load.add_argument("--api-key", default=os.environ.get("TANDEM_DAEMON_API_KEY", ""),
                      help="the daemon's API key (default: $TANDEM_DAEMON_API_KEY)")
    load.set_defaults(run=_loadgen)

    many = sub.add_parser("load", help="N concurrent streams for a bounded time: throughput, "
                                       "latency percentiles, batch sizes, peak RSS")
    many.add_argument("--streams", type=int, default=16)
    many.add_argument("--duration", type=float, default=20.0, help="seconds; requests that "
                                                                  "started in time finish")
    many.add_argument("--max-tokens", type=int, default=48)
    many.add_argument("--temperature", type=float, default=0.0)
    many.add_argument("--prompts-file", type=Path, default=Path("models/prompts/heldout.jsonl"))
    many.add_argument("--offset", type=int, default=0, help="index of the first prompt")
    many.add_argument("--url", default=None, help="a running daemon (default: start one)")
    many.add_argument("--cloud", default=None, help="its verifier HOST:PORT (several: "
                                                    "comma-separated), for batch sizes")
    many.add_argument("--verifiers", type=int, default=1, help=(
        "verifiers to start, all behind the daemon (its cloud.load_balancing: round_robin by "
        "default; --edge-arg=--set --edge-arg=cloud.load_balancing=ring_hash for affinity)"))
    many.add_argument("--pid", action="append", default=[], metavar="NAME=PID",
                      help="with --url: processes whose peak RSS to report")
    many.add_argument("--cloud-arg", action="append", default=[],
                      help="extra argument for the started tandem-cloud serve (repeatable)")
    many.add_argument("--edge-arg", action="append", default=[],
                      help="extra argument for the started tandem-edge serve (repeatable)")
    many.add_argument("--log-dir", type=Path, default=Path("out/load"))
    many.add_argument("--compare-cloud-only", action="store_true", help=(
        "then run the same streams against a fresh verifier with k = 0 rounds (the target "
        "alone) and compare the server's side: passes per token, goodput per core"))
    many.add_argument("--json", type=Path, default=None)
    many.set_defaults(run=_load)

    add_bench_parser(sub)
    add_capacity_parser(sub)
    for verb, (module, summary) in OWN_PARSER_VERBS.items():
        own = sub.add_parser(verb, add_help=False, help=f"{summary} ({module}; `tandem {verb} "
                                                        f"-h` for its options)")
        own.add_argument("options", nargs=argparse.REMAINDER)
        own.set_defaults(run=lambda args, verb=verb: _own_parser(verb, args.options))
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in OWN_PARSER_VERBS:  # its own parser, options and -h included
        return _own_parser(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ConfigError, OSError) as exc:
        return fail("tandem", exc)


if __name__ == "__main__":
    raise SystemExit(main())
