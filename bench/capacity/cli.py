"""The `tandem capacity` subcommand (wired into bench/cli.py)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

from bench.capacity.options import CONFIGS, CapacityOptions

DEFAULT_OUT = Path("out/capacity")
DEFAULT_CHANNELS = ("configs/channels/lte.yaml", "configs/channels/wifi.yaml")
DEFAULT_DEVICES = ("phone", "laptop")
# The cells: phone x lte and laptop x wifi (not every channel x device pair).
DEFAULT_CELLS = (("lte", "phone"), ("wifi", "laptop"))


def _csv(kind):
    def parse(text: str):
        try:
            return tuple(kind(x) for x in text.split(",") if x)
        except ValueError:
            raise argparse.ArgumentTypeError(f"comma-separated {kind.__name__}s, not {text!r}") from None
    return parse


def add_parser(sub) -> None:
    defaults = CapacityOptions()
    p = sub.add_parser("capacity", help="users served at an SLO by one verifier on one core: "
                                        "Tandem's configurations vs cloud-only and vLLM alone")
    p.add_argument("--channel", action="append", default=None, metavar="NAME|FILE.yaml",
                   help="a channel profile (configs/channels/NAME.yaml or a file; repeatable)")
    p.add_argument("--device", action="append", default=None, metavar="NAME",
                   help="a device profile (configs/devices/NAME.yaml or a file; repeatable). "
                        "Without --channel/--device: lte x phone and wifi x laptop; with them: "
                        "every channel x device")
    p.add_argument("--configs", type=_csv(str), default=defaults.configs,
                   help=f"comma-separated configurations, of {','.join(CONFIGS)} (default: the "
                        f"first five; adaptive-unpriced is the default controller on a verifier "
                        f"that never prices its passes)")
    p.add_argument("--users", type=_csv(int), default=defaults.users,
                   help="comma-separated user counts to sweep (default 1,2,4,...,256); a "
                        "configuration stops at its first miss of the SLO")
    p.add_argument("--no-refine", action="store_true",
                   help="no midpoint between a configuration's last pass and first miss")
    p.add_argument("--every-count", action="store_true",
                   help="measure every --users count, past a configuration's misses too")
    p.add_argument("--interleave", action=argparse.BooleanOptionalAction,
                   default=defaults.interleave,
                   help="measure each count for every configuration before the next count (all "
                        "their servers up, one measuring at a time): a drift of the machine's "
                        "speed then falls on both sides of a comparison alike (default; "
                        "--no-interleave sweeps one configuration after another)")
    p.add_argument("--samples", type=Path, default=None, metavar="PATH.jsonl",
                   help="also write every measured request here (python -m bench.capacity.compare "
                        "reads two such files)")
    p.add_argument("--slo-ttft-s", type=float, default=defaults.slo_ttft_s)
    p.add_argument("--slo-tpot-s", type=float, default=defaults.slo_tpot_s)
    p.add_argument("--also-tpot-s", type=_csv(float), default=defaults.extra_tpot_slos,
                   help="further TPOT SLOs to report capacity at (default 0.05)")
    p.add_argument("--warmup-s", type=float, default=defaults.warmup_s)
    p.add_argument("--window-s", type=float, default=defaults.window_s,
                   help="the measuring window of each point (requests started in it count)")
    p.add_argument("--drain-s", type=float, default=defaults.drain_s,
                   help="how long requests started in the window may run on after it")
    p.add_argument("--think-s", type=float, default=defaults.think_s,
                   help="a user's pause between a response and its next request")
    p.add_argument("--prompts", type=int, default=defaults.prompts)
    p.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    p.add_argument("--server-core", type=_csv(int), default=defaults.server_cores, metavar="CORE[,CORE...]",
                   help="the core the server is pinned to (default 0; the users run on the others); "
                        "with --verifiers, verifier i takes the i-th core of the list (cycling)")
    p.add_argument("--verifiers", type=int, default=defaults.verifiers,
                   help="server processes per configuration, users spread over them (default 1)")
    p.add_argument("--live-draft", action="store_true",
                   help="every user runs the real draft instead of the replay (small N only)")
    p.add_argument("--cloud-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a verifier config key (repeatable), e.g. model.device=cuda")
    p.add_argument("--json", type=Path, default=None, help=f"results (default {DEFAULT_OUT}/capacity.json)")
    p.add_argument("--plots", type=Path, default=None, help=f"PNG directory (default {DEFAULT_OUT})")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--paper", nargs=argparse.REMAINDER, default=None,
                   metavar="SURFACE.json [OPTIONS]",
                   help="no sweep: the users a verifier with this pass-cost surface holds, on "
                        "paper, from a run's measured inputs (`--paper -h`: bench/capacity/"
                        "paper_cli.py); the rest of the command line is its options")
    p.set_defaults(run=run)


def options_of(args: argparse.Namespace) -> CapacityOptions:
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown configurations {sorted(unknown)}; choose from {CONFIGS}")
    if not args.users or min(args.users) < 1:
        raise argparse.ArgumentTypeError("--users needs counts >= 1")
    if args.verifiers < 1 or not args.server_core:
        raise argparse.ArgumentTypeError("--verifiers needs >= 1 and --server-core a core")
    return replace(CapacityOptions(), configs=args.configs, users=args.users, refine=not args.no_refine,
                   every_count=args.every_count, interleave=args.interleave,
                   slo_ttft_s=args.slo_ttft_s, slo_tpot_s=args.slo_tpot_s,
                   extra_tpot_slos=tuple(t for t in args.also_tpot_s if t != args.slo_tpot_s),
                   warmup_s=args.warmup_s, window_s=args.window_s, drain_s=args.drain_s,
                   think_s=args.think_s, prompts=args.prompts, max_tokens=args.max_tokens,
                   server_cores=args.server_core, verifiers=args.verifiers, live_draft=args.live_draft,
                   cloud_sets=tuple(args.cloud_set))


def _channel_path(name: str) -> Path:
    path = Path(name)
    return path if path.suffix in (".yaml", ".yml") else Path("configs/channels") / f"{name}.yaml"


def run(args: argparse.Namespace) -> int:
    if args.paper is not None:
        from bench.capacity.paper_cli import main as paper
        return paper(args.paper)
    from bench.matrix.config import BenchConfig, load_device
    from bench.capacity.report import (capacities, capacity_table, cost_table, rows_table,
                                       summary_table, write_json, write_plots)
    from bench.capacity.sweep import run_capacity
    from sim.netem import load_profile
    from tandem.config import load_config, resolve_path

    try:
        options = options_of(args)
    except argparse.ArgumentTypeError as error:
        print(f"tandem capacity: {error}", file=sys.stderr)
        return 2
    bench = load_config(resolve_path(options.bench_config), BenchConfig)
    if args.channel is None and args.device is None:
        pairs = [(load_profile(resolve_path(_channel_path(c))), load_device(bench, d)) for c, d in DEFAULT_CELLS]
    else:
        channels = [load_profile(resolve_path(_channel_path(c))) for c in args.channel or DEFAULT_CHANNELS[:1]]
        devices = [load_device(bench, d) for d in args.device or DEFAULT_DEVICES[:1]]
        pairs = [(c, d) for c in channels for d in devices]
    json_path = args.json or DEFAULT_OUT / "capacity.json"
    plots_dir = args.plots or DEFAULT_OUT
    started = time.monotonic()

    def progress(text: str) -> None:
        if not args.no_progress:
            print(f"[capacity {time.monotonic() - started:6.0f} s] {text}", file=sys.stderr, flush=True)

    samples_file = None
    if args.samples is not None:
        args.samples.parent.mkdir(parents=True, exist_ok=True)
        samples_file = args.samples.open("w")

    def on_row(row, samples) -> None:
        if samples_file is not None:
            for sample in samples:
                samples_file.write(json.dumps({"channel": row.channel, "device": row.device,
                                               "config": row.config, "users": row.users,
                                               **asdict(sample)}) + "\n")
            samples_file.flush()
        progress(f"  {row.channel}/{row.device} {row.config} N={row.users}: good {row.good_share:.2f}, "
                 f"TPOT p90 {1000 * (row.tpot_p90_s or 0):.0f} ms, user p10 "
                 f"{row.user_tokens_per_s_p10 or 0:.1f} tok/s, errors {row.errors}")

    rows = []
    misses = 0
    try:
        for profile, device in pairs:
            result = run_capacity(options, bench, [profile], [device], plots_dir / "logs", progress, on_row)
            rows += result.rows
            misses += result.replay_misses
    finally:
        if samples_file is not None:
            samples_file.close()
    slos = (options.slo_tpot_s, *options.extra_tpot_slos)
    caps = capacities(rows, slos)
    print(rows_table(rows))
    print()
    print(f"Capacity: the largest N with >= 90% of requests good (TTFT <= {options.slo_ttft_s:g} s "
          f"and TPOT <= the SLO); {options.verifiers} server process(es) on core(s) "
          f"{','.join(map(str, options.server_cores))} of this machine's CPU")
    print(capacity_table(caps, slos))
    print()
    print(summary_table(rows, caps, options.slo_tpot_s))
    print()
    print("What a committed token cost the verifier: its CPU, and its passes as it measured them")
    print(cost_table(rows))
    meta = {"slo": {"ttft_s": options.slo_ttft_s, "tpot_s": list(slos), "good_share": 0.9},
            "options": {f.name: _plain(getattr(options, f.name)) for f in fields(options)},
            "replay_misses": misses, "wall_s": time.monotonic() - started}
    write_json(json_path, rows, caps, meta)
    written = write_plots(plots_dir, rows, options.slo_tpot_s) if rows else []
    print(f"\nJSON: {json_path}; plots: {', '.join(str(p) for p in written)}; replay misses {misses}")
    return 0


def _plain(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value
