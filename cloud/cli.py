"""tandem-cloud: run the verifier, or ask a running one what it serves.

  tandem-cloud serve --config configs/cloud.yaml [--host H] [--port P] [--model DIR]
                    [--device D] [--dtype T] [--metrics-port P] [--set KEY=VALUE ...]
  tandem-cloud info --cloud HOST:PORT [--api-key KEY] [--tls-ca CERT.pem]
  tandem-cloud check MODEL_DIR [--device D] [--dtype T] [--serving-path auto|slots|exact] [--json]

Where a setting comes from, highest first: these flags, `--set section.key=VALUE` (any key),
the environment (`TANDEM_CLOUD_<SECTION>__<KEY>`, e.g. TANDEM_CLOUD_SERVER__PORT=50052), the
config file, the defaults in cloud/config.py.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from cloud.config import CloudConfig
from tandem.cli import add_log_level, add_version, fail
from tandem.config import ConfigError, command_line, load_config

log = logging.getLogger("tandem.cloud")
ENV_PREFIX = "TANDEM_CLOUD_"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem-cloud", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="load the target and serve gRPC until SIGTERM")
    serve.add_argument("--config", type=Path, default=Path("configs/cloud.yaml"),
                       help="cloud YAML, any subset of keys (relative: against the current "
                            "directory, then the repository root)")
    serve.add_argument("--host", help="override server.host")
    serve.add_argument("--port", type=int, help="override server.port")
    serve.add_argument("--metrics-port", type=int,
                       help="override server.metrics_port (Prometheus /metrics; 0 = off)")
    serve.add_argument("--model", help="override model.path (any local HF causal-LM directory)")
    serve.add_argument("--device", help="override model.device (auto, cpu, cuda, cuda:N)")
    serve.add_argument("--dtype", help="override model.dtype (float32, float16, bfloat16)")
    serve.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                       help="override any config key, e.g. --set limits.max_sessions=8 "
                            "(repeatable; VALUE is read as YAML)")
    add_log_level(serve, "info")

    info = commands.add_parser("info", help="print a running verifier's Info as JSON")
    info.add_argument("--cloud", required=True, metavar="HOST:PORT")
    info.add_argument("--api-key")
    info.add_argument("--tls-ca", type=Path, help="PEM root certificate; TLS when given")
    info.add_argument("--timeout", type=float, default=10.0)

    check = commands.add_parser(
        "check", help="before serving your own model: which path serves it, an exactness "
                      "self-test, KV bytes per token; exit 1 when it would not be exact")
    check.add_argument("model_dir", metavar="MODEL_DIR", help="a local HF causal-LM directory")
    check.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    check.add_argument("--dtype", default="float32", help="float32, float16, bfloat16")
    check.add_argument("--serving-path", default="auto", choices=("auto", "slots", "exact"),
                       help="as model.serving_path: auto, or force one path")
    check.add_argument("--json", action="store_true", help="the report as JSON")

    args = parser.parse_args(argv)
    if args.command == "check":
        from cloud.check import run_check
        return run_check(args)
    return _serve(args) if args.command == "serve" else _info(args)


def load_cloud_config(args: argparse.Namespace) -> CloudConfig:
    """Defaults < config file < environment < --set < named flags."""
    flags = {"server": {"host": args.host, "port": args.port,
                        "metrics_port": args.metrics_port},
             "model": {"path": args.model, "device": args.device, "dtype": args.dtype}}
    return load_config(args.config, CloudConfig, command_line(args.set, flags),
                       env_prefix=ENV_PREFIX)


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=(args.log_level or "info").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_cloud_config(args)
    except (ConfigError, OSError, ValueError) as exc:
        return fail("tandem-cloud", exc)

    # Imported here so that --help, --version, config errors and `info` do not pay for torch.
    import torch
    from transformers.utils import logging as transformers_logging

    from cloud.server import create_server

    transformers_logging.disable_progress_bar()
    try:
        if config.model.threads:
            torch.set_num_threads(config.model.threads)
        server, port = create_server(config)
    except (ConfigError, OSError, ValueError, RuntimeError) as exc:
        return fail("tandem-cloud", exc)

    if config.server.metrics_port is not None:
        try:
            server.engine.metrics.serve(config.server.host, config.server.metrics_port)
        except OSError as exc:
            server.engine.shutdown()
            return fail("tandem-cloud", ConfigError(
                f"cannot serve metrics on {config.server.host}:{config.server.metrics_port}: "
                f"{exc.strerror or exc}"))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    runtime = server.engine.runtime
    log.info("verifier %s serving %s (%s, %s) on %s:%d, %s, %s", server.name, runtime.name,
             runtime.device, runtime.dtype, config.server.host, port,
             "TLS" if server.secure else "plaintext",
             "API key required" if config.server.resolved_api_keys() else "no API key")
    stop.wait()
    log.info("stopping: %.1f s grace for rounds in flight", config.server.shutdown_grace_s)
    server.stop().wait()
    log.info("stopped")
    return 0


def _info(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf.json_format import MessageToDict

    from cloud.auth import API_KEY_HEADER

    from tandem.v1 import decoding_pb2, decoding_pb2_grpc

    if args.tls_ca:
        try:
            root = args.tls_ca.read_bytes()
        except OSError as exc:
            return fail("tandem-cloud", exc)
        channel = grpc.secure_channel(args.cloud,
                                      grpc.ssl_channel_credentials(root_certificates=root))
    else:
        channel = grpc.insecure_channel(args.cloud)
    metadata = [(API_KEY_HEADER, args.api_key)] if args.api_key else None
    with channel:
        try:
            reply = decoding_pb2_grpc.DecodingStub(channel).Info(
                decoding_pb2.InfoRequest(), metadata=metadata, timeout=args.timeout)
        except grpc.RpcError as exc:
            print(f"tandem-cloud: {args.cloud}: {exc.code().name}: {exc.details()}",
                  file=sys.stderr)
            return 1
    print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
