"""`tandem`: the product's simulation verbs and, loaded only when named, the benchmarks'.

  tandem sim [--config configs/sim.yaml] [--json PATH] [--plots DIR]
      verifier + one link emulator per profile + edge daemon on loopback, the held-out
      workload through the daemon's HTTP API, a table per profile, JSON and PNG plots
  tandem loadgen --url http://HOST:8080 --requests N [--concurrency C]
      the same workload against a running daemon (docker-compose's loadgen service)
  tandem netem --profile FILE.yaml --listen HOST:PORT --upstream HOST:PORT
      the link emulator as a standalone TCP proxy (sim/netem/, compose's channel service)
  tandem load | bench | capacity | ladder | pass-cost | verifier-bench | fast-mode-bench |
         startup-race | failover | runtime-bench | e2e-report ...
      the benchmarks (bench/cli.py runs them; bench/README.md says what each measures)
Each has its own options: `tandem VERB -h`.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

from sim import loadgen
from tandem.cli import add_delegated, add_version, run_parsed
from tandem.config import command_line, load_config

DEFAULT_OUT = Path("out/sim")

# Verbs with their own argument parser (options and -h are theirs, prog "tandem VERB"), each
# loaded only when it runs (they import torch / grpc): verb -> (module whose main(argv) runs it,
# one line for `tandem -h`). The benchmarks' verbs all run through bench/cli.py.
OWN_PARSER_VERBS = {
    "netem": ("sim.netem.__main__", "the link emulator as a standalone TCP proxy"),
}
BENCH_VERBS = {
    "load": "N concurrent streams for a bounded time: throughput, latency percentiles, batch "
            "sizes, peak RSS",
    "bench": "every configuration per channel and device profile, paired, with goal verdicts",
    "capacity": "users one verifier serves at a latency SLO",
    "ladder": "the edge model ladder and fast mode: switching vs each local model alone, "
              "fast-mode curve",
    "pass-cost": "a target's verify-pass time surface on this device: sessions x tokens x "
                 "context, KV memory bound",
    "verifier-bench": "verifier goodput and round latency: torch vs vLLM backend vs target-only "
                      "decoding",
    "fast-mode-bench": "fast mode over min_agreement: verified share, agreement with the target, "
                       "per prompt source",
    "startup-race": "verifier and daemon started together under a burst of requests: what the "
                    "first ones get",
    "failover": "several verifiers behind the daemon, one killed under load: failed requests, "
                "re-opens, tokens/s",
    "runtime-bench": "prefill and decode tokens/s of each draft backend and the target",
    "e2e-report": "accepted length, passes and bytes per token on held-out prompts, greedy and "
                  "sampled",
}


def sim_config(args: argparse.Namespace):
    """`tandem sim`'s SimConfig: defaults < config file < environment < --set < named flags."""
    from sim.config import SimConfig

    flags = {"prompts": args.prompts, "max_tokens": args.max_tokens, "concurrency": args.concurrency,
             "profiles": args.profiles.split(",") if args.profiles else None}
    return load_config(args.config, SimConfig, command_line(args.set, flags),
                       env_prefix="TANDEM_SIM_")


def _sim(args: argparse.Namespace) -> int:
    config = sim_config(args)
    from sim.runner import print_report, run_sim  # loads torch / grpc only when simulating

    json_path = args.json if args.json is not None else DEFAULT_OUT / "sim.json"
    plots_dir = args.plots if args.plots is not None else DEFAULT_OUT
    result = run_sim(config, json_path=json_path, plots_dir=plots_dir, progress=not args.no_progress)
    print_report(result)
    return 1 if any(s.errors for s in result.summaries) else 0


def _delegate(verb: str, options: list[str]) -> int:
    """Run a verb whose parser lives elsewhere: its own module's, or bench/cli.py's."""
    if verb in OWN_PARSER_VERBS:
        status = importlib.import_module(OWN_PARSER_VERBS[verb][0]).main(options)
    else:
        status = importlib.import_module("bench.cli").main([verb, *options])
    return 0 if status is None else status


def _add_sim_parser(sub) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_sim_parser(sub)
    loadgen.add_parser(sub)
    delegated = {**{verb: f"{summary} ({module})" for verb, (module, summary) in OWN_PARSER_VERBS.items()},
                 **{verb: f"{summary} (bench/)" for verb, summary in BENCH_VERBS.items()}}
    for verb, summary in delegated.items():
        add_delegated(sub, verb, f"{summary}; `tandem {verb} -h`", _delegate)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and (argv[0] in OWN_PARSER_VERBS or argv[0] in BENCH_VERBS):
        return _delegate(argv[0], argv[1:])  # its own parser, options and -h included
    return run_parsed(build_parser(), argv)


if __name__ == "__main__":
    raise SystemExit(main())
