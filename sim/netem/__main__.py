"""`tandem netem --profile configs/channels/lte.yaml --listen 127.0.0.1:50052
--upstream 127.0.0.1:50051`: run the channel proxy until SIGTERM/SIGINT, printing its
measurements as one JSON line every --stats-every seconds (and once more on exit)."""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from sim.netem.profile import load_profile
from sim.netem.proxy import ChannelProxy
from tandem.config import ConfigError


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem netem", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="channel profile YAML (configs/channels/*.yaml)")
    parser.add_argument("--listen", type=host_port, default=("127.0.0.1", 50052),
                        help="HOST:PORT the proxy accepts on (default 127.0.0.1:50052)")
    parser.add_argument("--upstream", type=host_port, required=True, help="HOST:PORT to relay to")
    parser.add_argument("--stats-every", type=float, default=10.0,
                        help="seconds between stats lines; 0 = only on exit (default 10)")
    return parser


async def run(proxy: ChannelProxy, stats_every: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host, port = await proxy.open()
    print(json.dumps({"event": "listening", "profile": proxy.profile.name, "listen": f"{host}:{port}",
                      "upstream": "%s:%d" % proxy.upstream}), flush=True)
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=stats_every if stats_every > 0 else None)
            except asyncio.TimeoutError:
                print(json.dumps({"event": "stats", **proxy.stats().summary()}), flush=True)
    finally:
        print(json.dumps({"event": "stopped", **proxy.stats().summary()}), flush=True)
        await proxy.aclose()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        profile = load_profile(args.profile)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(run(ChannelProxy(profile, upstream=args.upstream, listen=args.listen), args.stats_every))
    except OSError as exc:
        print(f"error: cannot listen on {args.listen[0]}:{args.listen[1]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
