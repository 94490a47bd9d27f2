"""`tandem-edge serve`: the daemon's subcommand, registered by edge/cli.py.

    tandem-edge serve [--config configs/edge.yaml] [--host H] [--port P] [--cloud HOST:PORT]
                      [--api-key KEY] [--backend B] [--draft-model PATH] [--tokenizer-dir DIR]

Light on imports (argparse only) so that `tandem-edge --help` stays fast; the server, and with
it torch, uvicorn and the draft runtime, loads when the command runs.
"""
from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from tandem.cli import add_log_level, fail
from tandem.config import ConfigError


def add_serve_command(commands, add_config_options: Callable[[argparse.ArgumentParser], None],
                      load_edge_config: Callable[[argparse.Namespace], object]) -> None:
    """Register `serve` on edge/cli.py's subparsers, with its shared config options and loader."""
    serve = commands.add_parser("serve", help="the local OpenAI-compatible HTTP daemon")
    add_config_options(serve)
    serve.add_argument("--host", help="override daemon.host")
    serve.add_argument("--port", type=int, help="override daemon.port (0 = any free port)")
    add_log_level(serve, "daemon.log_level")
    serve.set_defaults(run=lambda args: run_serve(args, load_edge_config))


def run_serve(args: argparse.Namespace, load_edge_config: Callable[[argparse.Namespace], object]) -> int:
    try:
        config = load_edge_config(args)  # --host, --port and --log-level included
    except (ConfigError, OSError, ValueError) as exc:
        return fail("tandem-edge", exc)
    # Loaded after the config, so a config mistake is reported without loading torch.
    from edge.daemon.server import serve
    from edge.runtime.errors import MissingBackend
    level = "DEBUG" if config.daemon.log_level == "trace" else config.daemon.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(config)
    except (ConfigError, OSError, MissingBackend, ValueError, RuntimeError) as exc:
        return fail("tandem-edge", exc)
    return 0
