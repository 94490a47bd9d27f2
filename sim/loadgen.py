"""`tandem loadgen`: the held-out workload sent to a running daemon (docker-compose's loadgen
service), one table, optionally a JSON file."""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from tandem.config import resolve_path


def add_parser(sub) -> None:
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
    load.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sim.report import format_table, run_summary, write_json
    from sim.workload import advertised_model, run_workload
    from tandem.prompts import load_prompts

    model = args.model or advertised_model(args.url, api_key=args.api_key)
    prompts = load_prompts(resolve_path(args.prompts_file), args.requests, args.offset)
    t0 = time.monotonic()
    records = asyncio.run(run_workload(args.url, model, prompts, max_tokens=args.max_tokens,
                                       concurrency=args.concurrency, temperature=args.temperature,
                                       timeout_s=args.timeout, trace=False,
                                       api_key=args.api_key))
    summary = run_summary("run", records, time.monotonic() - t0)
    print(format_table([summary]))
    for record in records:
        if not record.ok:
            print(f"request {record.index} failed: {record.error}", file=sys.stderr)
    if args.json is not None:
        write_json(args.json, [summary], {"run": records}, {"url": args.url, "model": model})
    return 1 if summary.errors else 0
