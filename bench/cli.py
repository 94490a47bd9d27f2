"""The benchmarks' verbs of `tandem` (the command is sim/cli.py, which loads this module only
when one of them is named; `tandem -h` lists them with one line each, sim/cli.py BENCH_VERBS):

  tandem load --streams N --duration S [--max-tokens T] [--verifiers V]
      N concurrent streams through a daemon against V verifiers (all started as processes):
      tokens/s total and per stream, p50/p99 TTFT and TPOT, verifier batch sizes, peak RSS
  tandem bench ...           every configuration per channel and device profile (bench/matrix/)
  tandem capacity ...        users one verifier serves at a latency SLO (bench/capacity/)
  tandem ladder ...          the edge model ladder and the fast-mode curve (bench/ladder.py)
  tandem pass-cost ...       a target's verify-pass time surface (bench/passcost/)
  tandem verifier-bench ...  verifier goodput: torch vs vLLM vs target-only (bench/verifier_bench.py)
  tandem fast-mode-bench ... fast mode's verified share and agreement (bench/fast_mode_bench.py)
  tandem startup-race ...    verifier and daemon started together under load (bench/startup_race.py)
  tandem failover ...        a verifier killed under load behind the daemon (bench/failover.py)
  tandem runtime-bench ...   tokens/s of each draft backend and the target (bench/runtimes.py)
  tandem e2e-report ...      accepted length, passes and bytes per token (bench/e2e_report.py)
Each has its own options: `tandem VERB -h`.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from bench.matrix.cli import add_parser as add_bench_parser
from bench.capacity.cli import add_parser as add_capacity_parser
from sim.cli import BENCH_VERBS
from tandem.cli import add_delegated, add_version, run_parsed
from tandem.config import resolve_path

# Benchmarks with their own argument parser (options and -h are theirs, prog "tandem VERB"):
# verb -> module whose main(argv) runs it. Their modules import torch / grpc, so each loads only
# when its verb runs; their one-line summaries are sim/cli.py's BENCH_VERBS.
OWN_PARSER_VERBS = {
    "ladder": "bench.ladder",
    "pass-cost": "bench.passcost.cli",
    "verifier-bench": "bench.verifier_bench",
    "fast-mode-bench": "bench.fast_mode_bench",
    "startup-race": "bench.startup_race",
    "failover": "bench.failover",
    "runtime-bench": "bench.runtimes",
    "e2e-report": "bench.e2e_report",
}


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
    status = importlib.import_module(OWN_PARSER_VERBS[verb]).main(options)
    return 0 if status is None else status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)

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
    for verb, module in OWN_PARSER_VERBS.items():
        add_delegated(sub, verb, f"{BENCH_VERBS[verb]} ({module}; `tandem {verb} -h` for its "
                                 "options)", _own_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in OWN_PARSER_VERBS:  # its own parser, options and -h included
        return _own_parser(argv[0], argv[1:])
    return run_parsed(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
