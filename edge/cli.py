"""tandem-edge: run the draft on this device against a verifier.

  tandem-edge generate --cloud HOST:PORT (--prompt TEXT | --prompt-file F) --max-tokens N
                       [--temperature T --top-k K --top-p P --seed S] [--draft-length K]
                       [--config configs/edge.yaml] [--backend B] [--draft-model PATH]
                       [--tokenizer-dir DIR] [--api-key KEY] [--ignore-eos] [--json]

Where a setting comes from, highest first: these flags, `--set section.key=VALUE` (any key),
the environment (`TANDEM_EDGE_<SECTION>__<KEY>`, e.g. TANDEM_EDGE_CLIENT__DRAFT_LENGTH=8), the
config file, the defaults in edge/config.py. Human output: the completion on stdout, one stats
line on stderr. --json prints one object.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edge.config import EdgeConfig, model_for_backend, resolve_paths
from tandem.cli import add_version, fail
from tandem.config import (ConfigError, command_line, load_config, parse_set_options,
                           resolve_path)

DEFAULT_CONFIG = Path("configs/edge.yaml")
ENV_PREFIX = "TANDEM_EDGE_"
_MODEL_SUFFIX = {"llama.cpp": ".gguf", "onnxruntime": ".onnx"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem-edge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_generate(commands)
    # `tandem-edge serve` (the local HTTP daemon, edge/daemon/command.py) registers here.
    from edge.daemon.command import add_serve_command
    add_serve_command(commands, _add_config_options, load_edge_config)
    args = parser.parse_args(argv)
    return args.run(args)


def _add_generate(commands) -> None:
    generate = commands.add_parser("generate", help="one generation against a verifier")
    generate.set_defaults(run=_generate)
    _add_config_options(generate)
    prompt = generate.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt text")
    prompt.add_argument("--prompt-file", type=Path, help="a file holding the prompt text")
    generate.add_argument("--max-tokens", type=int, required=True, help="new tokens at most")
    generate.add_argument("--temperature", type=float, help="0 = greedy (the default)")
    generate.add_argument("--top-k", type=int, help="0 = off")
    generate.add_argument("--top-p", type=float, help="1 = off")
    generate.add_argument("--seed", type=int, help="sampling seed")
    generate.add_argument("--draft-length", type=int,
                          help="draft K tokens every round of this generation (fixed k, whatever "
                               "client.policy says; 0 = the verifier generates)")
    generate.add_argument("--ignore-eos", action="store_true",
                          help="do not stop at the tokenizer's eos")
    generate.add_argument("--json", action="store_true", help="print one JSON object")


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="edge YAML (relative: against the current directory, then the "
                             "repository root)")
    parser.add_argument("--cloud", metavar="TARGET", help="override cloud.address: HOST:PORT or "
                        "any gRPC target naming several (ipv4:H1:P1,H2:P2, dns:///NAME:PORT)")
    parser.add_argument("--api-key", help="override cloud.api_key")
    parser.add_argument("--backend", choices=("llama.cpp", "onnxruntime", "torch"),
                        help="override draft.backend (the model file follows unless "
                             "--draft-model is given)")
    parser.add_argument("--draft-model", type=Path,
                        help="override draft.model_path; the tokenizer is then read from the "
                             "model's directory unless --tokenizer-dir is given")
    parser.add_argument("--tokenizer-dir", type=Path, help="override draft.tokenizer_dir")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override any config key, e.g. --set client.max_retries=2 "
                             "(repeatable; VALUE is read as YAML)")


def load_edge_config(args: argparse.Namespace) -> EdgeConfig:
    """Defaults < config file < environment < --set < named flags; paths resolved. Raises
    ConfigError (or FileNotFoundError for a missing model) with a one-line message."""
    flags = {"cloud": {"address": args.cloud, "api_key": args.api_key},
             "draft": {"backend": args.backend,
                       "model_path": str(args.draft_model) if args.draft_model else None,
                       "tokenizer_dir": str(args.tokenizer_dir) if args.tokenizer_dir
                       else None},
             "daemon": {"host": getattr(args, "host", None), "port": getattr(args, "port", None),
                        "log_level": getattr(args, "log_level", None)}}
    sets = getattr(args, "set", None)
    # The shipped default file is optional (schema defaults without it); a named one is not.
    path = None if args.config == DEFAULT_CONFIG and not resolve_path(args.config).exists() \
        else args.config
    config = load_config(path, EdgeConfig, command_line(sets, flags), env_prefix=ENV_PREFIX)
    # --draft-model and --backend bring their companions along (the tokenizer beside the
    # model, the backend's model file) unless the command line names those too.
    draft_set = parse_set_options(sets).get("draft", {})
    if args.draft_model and not args.tokenizer_dir and "tokenizer_dir" not in draft_set:
        config = config.model_copy(update={"draft": config.draft.model_copy(
            update={"tokenizer_dir": None})})
    config = resolve_paths(config)
    if args.backend and not args.draft_model and "model_path" not in draft_set:
        config = config.model_copy(update={"draft": config.draft.model_copy(
            update={"model_path": model_for_backend(config.draft)})})
    check_draft_files(config)
    return config


def check_draft_files(config: EdgeConfig) -> None:
    """The draft's model exists and is the kind of file its backend reads, so a mismatch is a
    one-line error here rather than a traceback from inside the runtime."""
    draft = config.draft
    path = draft.model_path
    if not path.exists():
        raise ConfigError(f"draft.model_path: {path} does not exist")
    if draft.backend == "torch":
        if not path.is_dir():
            raise ConfigError(f"draft.backend torch reads an HF model directory, but "
                              f"draft.model_path is the file {path}")
    elif path.suffix != _MODEL_SUFFIX[draft.backend]:
        raise ConfigError(f"draft.backend {draft.backend} reads a {_MODEL_SUFFIX[draft.backend]} "
                          f"file, but draft.model_path is {path}")
    if not (draft.resolved_tokenizer_dir / "tokenizer.json").exists():
        raise ConfigError(f"no tokenizer.json in {draft.resolved_tokenizer_dir} (set "
                          "draft.tokenizer_dir or --tokenizer-dir)")


def _generate(args: argparse.Namespace) -> int:
    try:
        config = load_edge_config(args)
    except (ConfigError, OSError, ValueError) as exc:
        return fail("tandem-edge", exc)
    # Imported here so that `--help` and config errors do not pay for loading torch.
    from edge.client import EdgeClient
    from edge.request import GenerationRequest
    from edge.link.errors import ClientError
    from edge.link.monitor import start_monitor
    from edge.link import call_metadata, make_channel
    from edge.runtime import load_draft_runtime
    from edge.runtime.errors import MissingBackend
    from edge.tokenizer import EdgeTokenizer
    from tandem.sampling import SamplingParams

    try:
        text = args.prompt if args.prompt is not None else args.prompt_file.read_text()
        sampling = SamplingParams(**{name: value for name, value in (
            ("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p),
            ("seed", args.seed)) if value is not None})
        tokenizer = EdgeTokenizer(config.draft.resolved_tokenizer_dir)
        draft = load_draft_runtime(config.draft)
    except (ConfigError, OSError, MissingBackend, ValueError, RuntimeError) as exc:
        return fail("tandem-edge", exc)

    prompt_ids = tokenizer.encode(text)
    if not prompt_ids:
        print("tandem-edge: the prompt is empty", file=sys.stderr)
        return 2
    channel = make_channel(config.cloud)
    monitor = None
    try:
        # Probed once before the generation: a misconfigured link (TLS, key, identity) fails
        # here with its cause instead of generating unverified (exit 1).
        monitor = start_monitor(config, channel, draft.fingerprint())
        client = EdgeClient(channel, draft, config.client, metadata=call_metadata(config.cloud),
                            monitor=monitor)
        result = client.generate(GenerationRequest(
            prompt_ids=prompt_ids, max_tokens=args.max_tokens, sampling=sampling,
            # The request's own k, as the HTTP field `draft_length`: client.draft_length would
            # be ignored by any policy but `fixed` (the shipped one is adaptive).
            draft_length=args.draft_length,
            stop_ids=frozenset() if args.ignore_eos else tokenizer.stop_ids))
    except (ClientError, ValueError) as exc:
        print(f"tandem-edge: {exc}", file=sys.stderr)
        return 1
    finally:
        if monitor is not None:
            monitor.stop()
        channel.close()
        draft.close()

    completion = tokenizer.decode(result.token_ids)
    if args.json:
        print(json.dumps({"text": completion, "prompt_tokens": len(prompt_ids),
                          "backend": draft.name, **result.as_dict()}))
    else:
        print(completion)
        print(stats_line(result), file=sys.stderr)
    return 0


def stats_line(result) -> str:
    unverified = result.verified.count(False)
    return (f"[{len(result.token_ids)} tokens ({result.finish_reason}), {result.rounds} rounds, "
            f"τ {result.mean_accepted_length:.2f}, {result.passes_per_token:.2f} target passes/"
            f"token, up {result.bytes_up} B, down {result.bytes_down} B, "
            f"ttft {result.ttft_s * 1000:.0f} ms, {result.wall_s:.2f} s"
            + (f", {unverified} unverified" if unverified else "")
            + (f", {result.reopens} re-opens" if result.reopens else "") + "]")


if __name__ == "__main__":
    sys.exit(main())
