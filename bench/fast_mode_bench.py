"""Fast mode as a user gets it, held to a stated agreement (issue 30):

    tandem fast-mode-bench [--min-agreements 0.9 0.95 0.97] [--sources code prose]
                           [--prompts 16] [--max-tokens 64] [--split eval] [--fixed-cut]
                           [--json PATH]

The shipped configs/edge.yaml (whatever its client.policy) in an edge daemon on loopback, in
front of a verifier with the shipped configs/cloud.yaml; held-out prompts of each source
(tandem/prompts.py: code, and prose from the held-out files' docstrings and comments;
by default the *eval* files, which the calibration prior was not fitted on) sent with
`"mode": "fast"` and `min_agreement`, greedy, eos ignored. Per min_agreement a fresh daemon
(its calibration starts from the shipped prior and learns over the sources in turn). Per
(min_agreement, source) it prints the curve's point:
  verified     share of emitted tokens the target verified
  agreement    teacher-forced: share of emitted tokens equal to the target's greedy choice after
               the same emitted prefix (one target pass over prompt + output)
  predicted    the calibration's expected agreement, from the responses' `tandem.agreement`
               (token-weighted): what the edge told the user it would be
  checked      the confident draft tokens the target checked (audits, verified rounds) and the
               share it agreed with
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM

from cloud.config import CloudConfig
from cloud.server import create_server
from edge.config import EdgeConfig, resolve_paths
from edge.daemon.server import DaemonThread, load_pool
from sim.writers import write_json
from tandem.config import load_config, resolve_path
from tandem.prompts import SOURCES, SPLITS, load_source

CONTEXT_TOKENS = 400  # the prompt's last tokens sent


@dataclass
class Point:
    min_agreement: float | None  # None: no stated agreement (--fixed-cut)
    source: str
    prompts: int
    tokens: int
    verified_share: float
    agreement: float            # teacher-forced
    predicted: float | None     # the responses' expected agreement, token-weighted
    checked: int                # confident draft tokens the target checked
    checked_agreement: float | None


def run_point(http: httpx.Client, url: str, model: str, target, prompts: list[list[int]],
              min_agreement: float | None, max_tokens: int, max_run: int | None) -> dict:
    verified = emitted = agree = checked = checked_agreed = 0
    predicted = 0.0
    for ids in prompts:
        body = {"model": model, "prompt": ids, "temperature": 0, "max_tokens": max_tokens,
                "ignore_eos": True, "mode": "fast", "return_token_ids": True}
        if min_agreement is not None:
            body["min_agreement"] = min_agreement
        if max_run is not None:
            body["max_unverified_run"] = max_run
        reply = http.post(url + "/v1/completions", json=body).json()
        out, stats = reply["choices"][0]["token_ids"], reply["tandem"]
        n = stats["verified_tokens"] + stats["unverified_tokens"]
        verified += stats["verified_tokens"]
        emitted += n
        agreement = stats["agreement"] or {"expected_agreement": 0.0, "checked_tokens": 0,
                                           "measured_agreement": None}
        predicted += agreement["expected_agreement"] * n
        checked += agreement["checked_tokens"]
        checked_agreed += round((agreement["measured_agreement"] or 0.0)
                                * agreement["checked_tokens"])
        with torch.inference_mode():
            greedy = target(torch.tensor([ids + out])).logits[0].argmax(-1).tolist()
        agree += sum(t == greedy[len(ids) + i - 1] for i, t in enumerate(out))
    return {"tokens": emitted, "verified_share": verified / emitted, "agreement": agree / emitted,
            "predicted": predicted / emitted if min_agreement is not None else None,
            "checked": checked,
            "checked_agreement": checked_agreed / checked if checked else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem fast-mode-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-agreements", type=float, nargs="*", default=[0.95])
    parser.add_argument("--sources", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    parser.add_argument("--split", default="eval", choices=SPLITS,
                        help="eval: files the calibration prior was not fitted on")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per source (0 = all)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-unverified-run", type=int, default=None,
                        help="the requests' bound; default: client.max_unverified_run")
    parser.add_argument("--edge-config", type=Path, default=Path("configs/edge.yaml"))
    parser.add_argument("--fixed-cut", action="store_true", help=(
        "one more point per source without a stated agreement (client.fast.min_agreement "
        "null): the entropy switch's fixed cut, what fast mode was before min_agreement"))
    parser.add_argument("--json", type=Path, help="write the points here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cloud = load_config(resolve_path(Path("configs/cloud.yaml")), CloudConfig,
                        {"server": {"host": "127.0.0.1", "port": 0}})
    target = AutoModelForCausalLM.from_pretrained(resolve_path(cloud.model.path),
                                                  dtype=torch.float32).eval()
    server, port = create_server(cloud)
    server.start()
    overrides = {"cloud": {"address": f"127.0.0.1:{port}"},
                 "daemon": {"host": "127.0.0.1", "port": 0, "pool_size": 1}}
    edge = resolve_paths(load_config(resolve_path(args.edge_config), EdgeConfig, overrides))
    # (load_config drops None overrides as "not given": null the field on the loaded config)
    client = edge.client.model_copy(update={
        "fast": edge.client.fast.model_copy(update={"min_agreement": None})})
    fixed = edge.model_copy(update={"client": client})
    texts = {s: load_source(resolve_path(SOURCES[s]), args.split, args.prompts or None)
             for s in args.sources}
    points: list[Point] = []
    try:
        with httpx.Client(timeout=120) as http:
            for a in args.min_agreements + ([None] if args.fixed_cut else []):
                # a fresh daemon: its calibration starts from the prior
                with DaemonThread(load_pool(edge if a is not None else fixed)) as daemon:
                    for source, prompts in texts.items():
                        ids = [http.post(daemon.url + "/tokenize", json={"prompt": t}).json()
                               ["tokens"][-CONTEXT_TOKENS:] for t in prompts]
                        got = run_point(http, daemon.url, edge.daemon.model_name, target, ids,
                                        a, args.max_tokens, args.max_unverified_run)
                        points.append(Point(min_agreement=a, source=source,
                                            prompts=len(ids), **got))
                        print(row(points[-1]), flush=True)
    finally:
        server.stop(0).wait()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, [asdict(p) for p in points], indent=1)
    return 0


def row(p: Point) -> str:
    checked = (f"{p.checked_agreement:.1%} of {p.checked}" if p.checked_agreement is not None
               else "none")
    stated = f"min_agreement {p.min_agreement:.2f}" if p.min_agreement is not None \
        else "fixed cut (no min_agreement)"
    predicted = f"{p.predicted:.1%}" if p.predicted is not None else "n/a"
    return (f"{stated} {p.source:5} ({p.prompts} prompts, {p.tokens} tokens): verified "
            f"{p.verified_share:.1%}, teacher-forced agreement {p.agreement:.1%}, predicted "
            f"{predicted}, confident tokens checked: {checked} agreed")


if __name__ == "__main__":
    sys.exit(main())
