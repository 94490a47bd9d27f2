"""What the three command lines (tandem, tandem-cloud, tandem-edge) share: `--version`,
`--log-level` checked against the logging levels, and one-line errors.

Light on imports (argparse and the standard library only), so `--help` and `--version` answer
without loading torch or grpc.
"""
from __future__ import annotations

import argparse
import sys
from importlib import metadata

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def version() -> str:
    try:
        return metadata.version("tandem")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")


def log_level(text: str) -> str:
    """argparse type for --log-level: a logging level name, any case; a clear error otherwise."""
    level = text.strip().lower()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a log level; choose one of {', '.join(LOG_LEVELS)}")
    return level


def add_log_level(parser: argparse.ArgumentParser, help_default: str) -> None:
    parser.add_argument("--log-level", type=log_level, default=None, metavar="LEVEL",
                        help=f"{'/'.join(LOG_LEVELS)} (default: {help_default})")


def fail(prog: str, exc: BaseException, status: int = 2) -> int:
    """Print `prog: message` on one line to stderr and return the exit status."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename and str(exc.filename) not in message:
        message = f"{message}: {exc.filename}"
    print(f"{prog}: {message}", file=sys.stderr)
    return status


def add_delegated(sub, verb: str, summary: str, run) -> None:
    """A verb whose options and -h belong to another parser: `run(verb, options)` gets all that
    follows it."""
    own = sub.add_parser(verb, add_help=False, help=summary)
    own.add_argument("options", nargs=argparse.REMAINDER)
    own.set_defaults(run=lambda args: run(verb, args.options))


def run_parsed(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """Parse `argv` and run the chosen verb's `run(args)`; a config or file error is one line."""
    from tandem.config import ConfigError  # pydantic: loaded once a verb runs, not for --help

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ConfigError, OSError) as exc:
        return fail(parser.prog, exc)
