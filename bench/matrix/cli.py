"""The `tandem bench` subcommand (wired into bench/cli.py)."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from tandem.config import ConfigError, command_line, load_config, resolve_path

DEFAULT_OUT = Path("out/bench")


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="adaptive draft length vs fixed k, peers' rules, "
                                         "cloud-only, edge-only and an oracle, per channel and device")
    bench.add_argument("--config", type=Path, default=Path("configs/bench.yaml"))
    bench.add_argument("--channel", action="append", type=Path, default=None, metavar="FILE.yaml",
                       help="a channel profile file (repeatable; replaces the config's list)")
    bench.add_argument("--device", action="append", default=None, metavar="NAME",
                       help="a device profile name in configs/devices or a YAML file (repeatable)")
    bench.add_argument("--configs", default=None,
                       help="comma-separated subset of configurations, e.g. fixed-k4,adaptive")
    bench.add_argument("--prompts", type=int, default=None, help="override prompts per configuration")
    bench.add_argument("--offsets", type=_offsets, default=None, metavar="N | S,S,...",
                       help="trace offsets per prompt on a trace-driven channel: a count spread "
                            "evenly over the trace, or seconds into it (one second value: 30.0); "
                            "each (prompt, offset) is one paired unit")
    bench.add_argument("--held-out-trace", action="append", type=Path, default=None, metavar="PATH",
                       help="add a channel replaying this mahimahi trace (PATH, or PATH.up and "
                            "PATH.down) with the delay and loss of held_out_base (configs/channels/"
                            "lte.yaml); repeatable"),
    bench.add_argument("--max-tokens", type=int, default=None, help="override tokens per request")
    bench.add_argument("--json", type=Path, default=None, help=f"results (default {DEFAULT_OUT}/bench.json)")
    bench.add_argument("--plots", type=Path, default=None, help=f"PNG directory (default {DEFAULT_OUT})")
    bench.add_argument("--markdown", type=Path, default=None,
                       help="also write the table and the goals as Markdown (for bench/README.md)")
    logs = bench.add_mutually_exclusive_group()
    logs.add_argument("--generations", type=Path, default=None, metavar="PATH.jsonl",
                      help="append every generation's numbers here as it finishes (a long run "
                           "that is stopped keeps what it measured)")
    logs.add_argument("--from-generations", type=Path, default=None, metavar="PATH.jsonl",
                      help="run nothing: report the table and the goals of an earlier (or stopped) "
                           "run from its --generations file; give the channel flags it ran with")
    bench.add_argument("--workers", type=int, default=None, metavar="N",
                       help="measure N cells (channel x device) at once, one process each "
                            "(default 1: one cell at a time)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                       help="override any bench config key (repeatable; VALUE is read as YAML)")
    bench.set_defaults(run=run)


def _offsets(text: str) -> int | list[float]:
    """--offsets 4 (a count) or --offsets 0,30,60 (seconds)."""
    try:
        return int(text) if "," not in text and "." not in text else [float(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a count or comma-separated seconds, not {text!r}") from None


def bench_config(args: argparse.Namespace):
    """`tandem bench`'s BenchConfig: defaults < config file < environment < --set < named
    flags."""
    from bench.matrix.config import BenchConfig

    flags = {"prompts": args.prompts, "max_tokens": args.max_tokens,
             "channels": [str(c) for c in args.channel] if args.channel else None,
             "devices": args.device, "offsets": args.offsets,
             "held_out_traces": [str(p) for p in args.held_out_trace] if args.held_out_trace else None,
             "workers": args.workers,
             "configurations": args.configs.split(",") if args.configs else None}
    return load_config(args.config, BenchConfig, command_line(args.set, flags),
                       env_prefix="TANDEM_BENCH_")


def run(args: argparse.Namespace) -> int:
    from bench.matrix.channels import held_out_profile
    from bench.matrix.config import load_device
    from sim.netem import load_profile

    config = bench_config(args)
    channels = [load_profile(resolve_path(path)) for path in config.channels]  # fail early
    channels += [held_out_profile(Path(path), resolve_path(config.held_out_base))
                 for path in config.held_out_traces]
    names = [c.name for c in channels]
    if len(set(names)) != len(names):
        raise ConfigError(f"two channels with one name: {names}")
    devices = [load_device(config, name) for name in config.devices]

    json_path = args.json if args.json is not None else DEFAULT_OUT / "bench.json"
    plots_dir = args.plots if args.plots is not None else DEFAULT_OUT
    if args.from_generations is not None:
        from bench.matrix.runner import BenchResult, report

        result = BenchResult(generations=_read_generations(args.from_generations))
        offsets = {p.name: config.offsets_for(p) for p in channels}
        return _print(report(result, config, channels, devices, offsets, json_path, plots_dir), args)

    from bench.matrix.runner import run_bench  # loads torch / grpc only when benchmarking

    log_file = None
    if args.generations is not None:
        args.generations.parent.mkdir(parents=True, exist_ok=True)
        log_file = args.generations.open("a")

    def on_generation(g) -> None:
        if log_file is not None:
            log_file.write(json.dumps({k: v for k, v in asdict(g).items() if k != "rounds_log"}) + "\n")
            log_file.flush()

    try:
        result = run_bench(config, channels, devices, json_path=json_path, plots_dir=plots_dir,
                           progress=not args.no_progress, on_generation=on_generation)
    finally:
        if log_file is not None:
            log_file.close()
    return _print(result, args)


def _read_generations(path: Path) -> list:
    from bench.matrix.results import GenerationSummary

    if not path.is_file():
        raise ConfigError(f"--from-generations: no file {path}")
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(GenerationSummary(**json.loads(line)))
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{path}:{number}: not a generation line ({e})") from None
    if not out:
        raise ConfigError(f"--from-generations: {path} holds no generations")
    return out


def _print(result, args: argparse.Namespace) -> int:
    from bench.matrix.report import format_goals, format_table
    from bench.matrix.results import details_of

    print(format_table(result.rows))
    print("\ngoals (measured in this run):")
    print(format_goals(result.goals))
    for d in details_of(result.generations):
        if d["unverified_share"] or d["reopens"]:
            print(f"note: {d['channel']}/{d['device']}/{d['config']}: {d['unverified_share']:.1%} "
                  f"of tokens committed without the target (local fallback), {d['reopens']} "
                  "stream re-opens")
    for name, why in result.skipped.items():
        print(f"skipped {name}: {why}")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(format_table(result.rows, markdown=True) + "\n\n"
                                 + format_goals(result.goals, markdown=True) + "\n")
        result.outputs.append(args.markdown)
    ran = f" in {result.elapsed_s:.0f} s" if result.elapsed_s else " (reported from a generations file)"
    print(f"\n{len(result.generations)} generations{ran}")
    for path in result.outputs:
        print(f"wrote {path}")
    return 0
