"""`tandem sim`: the whole system on loopback, one channel profile after another.

  verifier (cloud.server, in this process, 127.0.0.1:free port)
     ^ gRPC
  link emulator per profile (sim.netem.ChannelProxy: delay, jitter, capacity, loss, outages)
     ^ gRPC
  edge daemon per profile (edge.daemon: draft runtimes + session clients, HTTP on a free port)
     ^ HTTP, OpenAI API, streamed
  workload (sim.workload: held-out code prompts, `concurrency` at a time)

Profiles run one after another so they do not share the two CPU cores; each gets a fresh proxy
(its link time, and so its outages, start with the profile) and a fresh daemon pointed at it.
The verifier, and so the target model, is loaded once.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from cloud.config import CloudConfig
from cloud.server import create_server
from edge.config import EdgeConfig, resolve_paths
from edge.daemon.server import DaemonThread, load_pool
from sim.config import SimConfig
from sim.netem import ChannelProfile, ChannelProxy
from sim.report import RunSummary, format_table, session_trace, run_summary, write_json, write_plots
from sim.workload import RequestRecord, run_workload
from tandem.config import load_config, resolve_path
from tandem.prompts import load_prompts

log = logging.getLogger(__name__)


@dataclass
class SimResult:
    summaries: list[RunSummary] = field(default_factory=list)
    records: dict[str, list[RequestRecord]] = field(default_factory=dict)
    trace: list[dict] = field(default_factory=list)
    trace_profile: str = ""
    elapsed_s: float = 0.0
    outputs: list[Path] = field(default_factory=list)


def load_profile(config: SimConfig, name: str) -> ChannelProfile:
    path = resolve_path(config.channels_dir) / f"{name}.yaml"
    return load_config(path, ChannelProfile, config.profile_overrides.get(name))


def edge_config_for(config: SimConfig, verifier_address: str) -> EdgeConfig:
    """The shipped edge config + the simulation's overrides, pointed at one profile's proxy."""
    overrides = _merged(config.edge_overrides, {
        "cloud": {"address": verifier_address},
        "daemon": {"host": "127.0.0.1", "port": 0, "pool_size": config.concurrency,
                   "max_tokens_limit": max(config.max_tokens, 1),
                   "default_max_tokens": min(64, config.max_tokens)}})
    return resolve_paths(load_config(resolve_path(config.edge_config), EdgeConfig, overrides))


def cloud_config_for(config: SimConfig) -> CloudConfig:
    overrides = _merged(config.cloud_overrides, {"server": {"host": "127.0.0.1", "port": 0}})
    return load_config(resolve_path(config.cloud_config), CloudConfig, overrides)


def run_sim(config: SimConfig, json_path: Path | None = None, plots_dir: Path | None = None,
            progress: bool = True) -> SimResult:
    started = time.monotonic()
    prompts = load_prompts(resolve_path(config.prompts_file), config.prompts + config.warmup_requests,
                           config.prompt_offset, config.max_prompt_chars)
    warmup, measured = prompts[config.prompts:], prompts[:config.prompts]
    profiles = {name: load_profile(config, name) for name in config.profiles}  # fail early
    result = SimResult(trace_profile=config.trace_profile)

    server, port = create_server(cloud_config_for(config))
    server.start()
    bar = tqdm(total=config.prompts * len(profiles), unit="req", disable=not progress, leave=False)
    try:
        if warmup:
            bar.set_description("warm-up")
            _warm_up(config, port, warmup)
        for name, profile in profiles.items():
            bar.set_description(name)
            records, wall_s = _run_profile(config, profile, port, measured, lambda _: bar.update(1))
            result.records[name] = records
            result.summaries.append(run_summary(name, records, wall_s))
    finally:
        bar.close()
        server.stop(0).wait(30)

    trace_name = config.trace_profile if config.trace_profile in result.records else config.profiles[0]
    if trace_name != config.trace_profile:
        log.warning("trace_profile %r was not run: plotting %r instead", config.trace_profile,
                    trace_name)
    result.trace, result.trace_profile = session_trace(result.records[trace_name]), trace_name
    result.elapsed_s = time.monotonic() - started
    if json_path is not None:
        write_json(json_path, result.summaries, result.records,
                   {"config": config.model_dump(mode="json"), "elapsed_s": result.elapsed_s,
                    "trace": {"profile": trace_name, "rounds": result.trace}})
        result.outputs.append(json_path)
    if plots_dir is not None:
        result.outputs += write_plots(plots_dir, result.summaries, result.trace, trace_name)
    return result


def _warm_up(config: SimConfig, verifier_port: int, prompts: list[str]) -> None:
    """Untimed requests straight to the verifier (no link emulator): the target's first
    forward passes are slow, and no profile should pay for them."""
    edge = edge_config_for(config, f"127.0.0.1:{verifier_port}")
    with DaemonThread(load_pool(edge)) as daemon:
        asyncio.run(run_workload(daemon.url, edge.daemon.model_name, prompts, max_tokens=config.max_tokens,
                                 concurrency=config.concurrency, temperature=config.temperature,
                                 seed=config.seed, timeout_s=config.request_timeout_s, trace=False))


def _run_profile(config: SimConfig, profile: ChannelProfile, verifier_port: int, prompts: list[str],
                 on_done) -> tuple[list[RequestRecord], float]:
    """The workload through a fresh proxy and daemon. The proxy's link time (and so the
    profile's outage schedule) starts a moment before the first request: the daemon's load."""
    with ChannelProxy(profile, upstream=("127.0.0.1", verifier_port)) as proxy:
        host, proxy_port = proxy.address
        edge = edge_config_for(config, f"{host}:{proxy_port}")
        with DaemonThread(load_pool(edge)) as daemon:
            t0 = time.monotonic()
            records = asyncio.run(run_workload(
                daemon.url, edge.daemon.model_name, prompts, max_tokens=config.max_tokens,
                concurrency=config.concurrency, temperature=config.temperature, seed=config.seed,
                timeout_s=config.request_timeout_s, on_done=on_done))
            wall_s = time.monotonic() - t0
    for record in records:
        if not record.ok:
            log.warning("%s: request %d failed: %s", profile.name, record.index, record.error)
    return records, wall_s


def print_report(result: SimResult) -> None:
    print(format_table(result.summaries))
    print(f"\n{sum(s.requests for s in result.summaries)} requests in {result.elapsed_s:.1f} s")
    for path in result.outputs:
        print(f"wrote {path}")


def _merged(base: dict, extra: dict) -> dict:
    """Deep merge of two override mappings (extra wins)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
