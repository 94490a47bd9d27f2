"""tandem-cloud: run the verifier, or ask a running one what it serves.

  tandem-cloud serve --config configs/cloud.yaml [--host H] [--port P] [--model DIR]
                    [--device D] [--dtype T]
  tandem-cloud info --cloud HOST:PORT [--api-key KEY] [--tls-ca CERT.pem]
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

import grpc
import torch

from cloud.auth import API_KEY_HEADER
from cloud.config import CloudConfig
from tandem.config import ConfigError, load_config, resolve_path

log = logging.getLogger("tandem.cloud")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem-cloud", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="load the target and serve gRPC until SIGTERM")
    serve.add_argument("--config", type=Path, default=Path("configs/cloud.yaml"))
    serve.add_argument("--host", help="override server.host")
    serve.add_argument("--port", type=int, help="override server.port")
    serve.add_argument("--model", help="override model.path (any local HF causal-LM directory)")
    serve.add_argument("--device", help="override model.device (auto, cpu, cuda, cuda:N)")
    serve.add_argument("--dtype", help="override model.dtype (float32, float16, bfloat16)")
    serve.add_argument("--log-level", default="INFO")

    info = commands.add_parser("info", help="print a running verifier's Info as JSON")
    info.add_argument("--cloud", required=True, metavar="HOST:PORT")
    info.add_argument("--api-key")
    info.add_argument("--tls-ca", type=Path, help="PEM root certificate; TLS when given")
    info.add_argument("--timeout", type=float, default=10.0)

    args = parser.parse_args(argv)
    return _serve(args) if args.command == "serve" else _info(args)


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Imported here so that `tandem-cloud info` does not pay for torch + transformers setup.
    from transformers.utils import logging as transformers_logging

    from cloud.service import create_server

    transformers_logging.disable_progress_bar()

    config_path = resolve_path(args.config)
    overrides = {"server": {"host": args.host, "port": args.port},
                 "model": {"path": args.model, "device": args.device, "dtype": args.dtype}}
    try:
        config = load_config(config_path, CloudConfig, overrides)
        if config.model.threads:
            torch.set_num_threads(config.model.threads)
        server, port = create_server(config)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"tandem-cloud: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    runtime = server.engine.runtime
    log.info("serving %s (%s, %s) on %s:%d, %s, %s", runtime.name, runtime.device, runtime.dtype,
             config.server.host, port, "TLS" if server.secure else "plaintext",
             "API key required" if config.server.resolved_api_keys() else "no API key")
    stop.wait()
    log.info("stopping: %.1f s grace for rounds in flight", config.server.shutdown_grace_s)
    server.stop().wait()
    log.info("stopped")
    return 0


def _info(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from tandem.v1 import decoding_pb2, decoding_pb2_grpc

    if args.tls_ca:
        channel = grpc.secure_channel(
            args.cloud, grpc.ssl_channel_credentials(root_certificates=args.tls_ca.read_bytes()))
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
