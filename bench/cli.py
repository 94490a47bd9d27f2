"""`tandem`: the benchmark harness's command line.

  tandem sim [--config configs/sim.yaml] [--json PATH] [--plots DIR]
      verifier + one channel emulator per profile + edge daemon on loopback, the held-out
      workload through the daemon's HTTP API, a table per profile, JSON and PNG plots
  tandem loadgen --url http://HOST:8080 --requests N [--concurrency C]
      the same workload against a running daemon (docker-compose's loadgen service)
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

from bench.sim_config import SimConfig
from tandem.config import ConfigError, load_config, resolve_path

DEFAULT_OUT = Path("out/sim")


def _sim(args: argparse.Namespace) -> int:
    from bench.sim import print_report, run_sim  # loads torch / grpc only when simulating

    overrides = {"prompts": args.prompts, "max_tokens": args.max_tokens, "concurrency": args.concurrency,
                 "profiles": args.profiles.split(",") if args.profiles else None}
    config = load_config(resolve_path(args.config), SimConfig, overrides)
    json_path = args.json if args.json is not None else DEFAULT_OUT / "sim.json"
    plots_dir = args.plots if args.plots is not None else DEFAULT_OUT
    result = run_sim(config, json_path=json_path, plots_dir=plots_dir, progress=not args.no_progress)
    print_report(result)
    return 1 if any(s.errors for s in result.summaries) else 0


def _loadgen(args: argparse.Namespace) -> int:
    from bench.report import format_table, summarize, write_json
    from bench.workload import advertised_model, load_prompts, run_workload

    model = args.model or advertised_model(args.url)
    prompts = load_prompts(resolve_path(args.prompts_file), args.requests, args.offset)
    t0 = time.monotonic()
    records = asyncio.run(run_workload(args.url, model, prompts, max_tokens=args.max_tokens,
                                       concurrency=args.concurrency, temperature=args.temperature,
                                       timeout_s=args.timeout, trace=False))
    summary = summarize("run", records, time.monotonic() - t0)
    print(format_table([summary]))
    for record in records:
        if not record.ok:
            print(f"request {record.index} failed: {record.error}", file=sys.stderr)
    if args.json is not None:
        write_json(args.json, [summary], {"run": records}, {"url": args.url, "model": model})
    return 1 if summary.errors else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
    load.set_defaults(run=_loadgen)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"tandem: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
