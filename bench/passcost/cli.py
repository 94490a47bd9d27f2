"""`tandem pass-cost`: a target's verify-pass time surface on the device it runs on.

  tandem pass-cost [--model DIR | --shape llama-1b|llama-8b|qwen-7b [--layers L]]
                   [--device auto] [--dtype float32] [--batches 1,2,...,256]
                   [--tokens 1,2,4,6,8,12] [--contexts 256,1024] [--reps 5] [--out DIR]

Passes of B sessions feeding n tokens each at context c (every session holds c - n positions
before the pass) through the verifier's own batched path (TargetRuntime.forward over the KV
pool: packed passes, slot attention), medians over --reps with their min and max. Writes
surface.json (what `tandem capacity --paper` reads), surface.csv and surface.png to --out and
prints per context and batch: the 1-token pass, a session's share of it (step), what a fed
position adds (c, TargetRuntime.position_ms) and their ratio, the position cost the verifier
publishes (Opened.position_cost = c / step); then KV bytes per token and the most sessions the
device's free memory holds at each context. --probe N also runs the verifier's own c probe N
times on the same runtime, for its noise.

The target: the verifier config's (configs/cloud.yaml model.path) by default, any local HF
directory (--model), or a random-weight model of a named shape (--shape: the published
architecture from a transformers config, nothing downloaded, written to a temporary directory
with the shipped tokenizer and removed after).
"""
from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

from bench.passcost.measure import MEMORY_RESERVE, Grid, PassTimer, free_memory_bytes
from bench.passcost.shapes import SHAPES, write_random_model
from bench.passcost.surface import Surface

DEFAULT_OUT = Path("out/pass-cost")


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers, not {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem pass-cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", type=Path, default=None,
                       help="a local HF causal-LM directory (default: the verifier config's)")
    which.add_argument("--shape", choices=sorted(SHAPES), default=None,
                       help="a random-weight target of this published shape")
    p.add_argument("--layers", type=int, default=None,
                   help="with --shape: this many layers instead of the shape's (a quick look)")
    p.add_argument("--vocab", type=int, default=None,
                   help="with --shape: this vocabulary size instead of the shape's (smoke runs: "
                        "the output head then costs less than the real model's)")
    p.add_argument("--cloud-config", type=Path, default=Path("configs/cloud.yaml"))
    p.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda[:N]")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--batches", type=_ints, default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    p.add_argument("--tokens", type=_ints, default=[1, 2, 4, 6, 8, 12],
                   help="new tokens per session in a pass (k + 1 for a round of k)")
    p.add_argument("--contexts", type=_ints, default=[256, 1024],
                   help="positions each session holds after the pass")
    p.add_argument("--reps", type=int, default=5, help="timed passes per point (one more "
                                                       "untimed first)")
    p.add_argument("--prefill-tokens", type=int, default=1024,
                   help="tokens per pass while filling the sessions' contexts")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop measuring this long after the start, model writing and loading "
                        "included (what is measured is written)")
    p.add_argument("--probe", type=int, default=3, metavar="N",
                   help="also run the verifier's own position-cost probe N times, each paired "
                        "with the same c from this timer's passes (0: not)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = default")
    p.add_argument("--out", type=Path, default=None, help=f"directory (default "
                                                          f"{DEFAULT_OUT}/NAME)")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from cloud.runtime.target import TargetRuntime, resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.monotonic()

    def progress(text: str) -> None:
        if not args.quiet:
            print(f"[pass-cost {time.monotonic() - started:6.1f} s] {text}", file=sys.stderr,
                  flush=True)

    # A step's `timeout` sends SIGTERM: exit through the finally below, so a random model's
    # temporary directory (GBs) goes too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    made = None
    if args.shape:
        progress(f"writing a random {args.shape} ({args.layers or 'all'} layers, {args.dtype})")
        made = model_dir = write_random_model(args.shape, args.dtype, args.device, args.layers,
                                              args.vocab)
        name = args.shape + (f"-{args.layers}l" if args.layers else "") + \
            (f"-v{args.vocab}" if args.vocab else "")
    else:
        model_dir = args.model or _config_model(args.cloud_config)
        name = model_dir.name
    try:
        device = resolve_device(args.device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        runtime = TargetRuntime(model_dir, device=args.device, dtype=args.dtype, name=name)
        free = free_memory_bytes(runtime.device)
        timer = PassTimer(runtime, int(free * (1.0 - MEMORY_RESERVE)))
        grid = Grid(args.batches, args.tokens, args.contexts, args.reps, args.prefill_tokens,
                    started + args.max_seconds if args.max_seconds else None)
        progress(f"{name} on {runtime.device} ({args.dtype}): {runtime.bytes_per_token} KV "
                 f"bytes per token, {free / 2**30:.1f} GiB free")
        points = timer.surface(grid, progress)
        probes = _probe(runtime, args.probe, progress)
        # The runtime serves a target by its slot pool when its self-test passes, else by the
        # exact path (cloud/runtime/serving_path.py); the surface says which it timed.
        serving = getattr(getattr(runtime, "path", None), "name", "slots")
        if serving != "slots":
            progress(f"note: {name} is served by the {serving} path, not the slot pool")
        surface = Surface(source=f"tandem pass-cost, measured {time.strftime('%Y-%m-%d %H:%M')}"
                          f" UTC", device=_device_name(runtime.device), model=name,
                          dtype=args.dtype, kv_bytes_per_token=runtime.bytes_per_token,
                          serving_path=serving,
                          kv_room_bytes=timer.kv_room, points=points, skipped=timer.skipped,
                          probe_pairs=[list(pair) for pair in probes])
        if probes:
            surface.notes.append(
                f"c, the ms a fed position adds (8 sessions at 64 positions, 1 vs 9 tokens), "
                f"{len(probes)} pairs: the verifier's probe (TargetRuntime.position_ms) "
                f"{_spread([p for p, _ in probes])}, this timer "
                f"{_spread([t for _, t in probes])}")
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
    out = args.out or DEFAULT_OUT / name
    out.mkdir(parents=True, exist_ok=True)
    surface.write(out / "surface.json", out / "surface.csv")
    from bench.passcost.report import surface_table, write_plot
    print(surface_table(surface))
    written = write_plot(surface, out / "surface.png") if surface.points else None
    print(f"written: {out / 'surface.json'}, {out / 'surface.csv'}"
          + (f", {written}" if written else ""))
    return 0 if surface.points else 1


def _probe(runtime, rounds: int, progress) -> list[tuple[float, float]]:
    if rounds <= 0:
        return []
    from bench.passcost.measure import paired_probe
    progress(f"the verifier's position probe and the timer's, paired, x{rounds}")
    return paired_probe(runtime, rounds)


def _spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):.4f} [min {min(values):.4f}, max "
            f"{max(values):.4f}]")


def _config_model(cloud_config: Path) -> Path:
    from cloud.config import CloudConfig
    from tandem.config import load_config, resolve_path

    return resolve_path(load_config(resolve_path(cloud_config), CloudConfig).model.path)


def _device_name(device) -> str:
    if device.type == "cuda":
        import torch
        return torch.cuda.get_device_name(device)
    import platform
    return f"cpu ({platform.processor() or platform.machine()}, {_threads()} threads)"


def _threads() -> int:
    import torch
    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())
