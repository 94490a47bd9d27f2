"""`tandem-edge serve`: the daemon's subcommand, registered by edge/cli.py.

    tandem-edge serve [--config configs/edge.yaml] [--host H] [--port P] [--cloud HOST:PORT]
                      [--api-key KEY] [--backend B] [--draft-model PATH] [--tokenizer-dir DIR]

Light on imports (argparse only) so that `tandem-edge --help` stays fast; the server, and with
it torch, uvicorn and the draft runtime, loads when the command runs.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from tandem.config import ConfigError


def add_serve_command(commands, add_config_options: Callable[[argparse.ArgumentParser], None],
                      load_edge_config: Callable[[argparse.Namespace], object]) -> None:
    """Register `serve` on edge/cli.py's subparsers, with its shared config options and loader."""
    serve = commands.add_parser("serve", help="the local OpenAI-compatible HTTP daemon")
    add_config_options(serve)
    serve.add_argument("--host", help="override daemon.host")
    serve.add_argument("--port", type=int, help="override daemon.port (0 = any free port)")
    serve.set_defaults(run=lambda args: run_serve(args, load_edge_config))


def run_serve(args: argparse.Namespace, load_edge_config: Callable[[argparse.Namespace], object]) -> int:
    from edge.daemon.server import serve
    from edge.runtime.errors import MissingBackend

    try:
        config = load_edge_config(args)
        updates = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
        daemon = type(config.daemon).model_validate({**config.daemon.model_dump(), **updates})
        config = config.model_copy(update={"daemon": daemon})
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"tandem-edge: {exc}", file=sys.stderr)
        return 2
    level = "DEBUG" if config.daemon.log_level == "trace" else config.daemon.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(config)
    except (FileNotFoundError, MissingBackend) as exc:
        print(f"tandem-edge: {exc}", file=sys.stderr)
        return 2
    return 0
