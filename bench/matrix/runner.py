"""`tandem bench`: the same held-out prompts through every configuration, channel and device.

Per cell (device, channel: bench/matrix/cell.py) the units run in turn, a unit being one (prompt,
trace offset), and for each unit every configuration, each with the channel rewound to the
unit's offset (the same stretch of the trace, the same jitter and loss draws), so that all
configurations of a unit meet the same link and a drift of this shared machine's load hits them
alike; the goal ratios are then paired per unit (bench/matrix/goals.py). Cells run one after
the other in this process, or in several processes at once (bench/matrix/workers.py,
`--workers`). edge-only runs the draft alone (no verifier); cloud-only asks the verifier to
generate (Plan.cloud_generate); the oracle drafts exactly the accepted length known in advance
(bench/matrix/oracle.py).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from bench.matrix.cell import CellBench, build_policy, cells_of, client_config, edge_config_of
from bench.matrix.config import BenchConfig, DeviceSpec
from bench.matrix.goals import goals
from bench.matrix.results import BenchRow, GenerationSummary, details_of, rows_of
from bench.matrix.workers import run_in_workers
from sim.netem import ChannelProfile
from edge.config import ClientConfig
from tandem.config import ConfigError

log = logging.getLogger(__name__)


@dataclass
class BenchResult:
    generations: list[GenerationSummary] = field(default_factory=list)
    rows: list[BenchRow] = field(default_factory=list)
    goals: list = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)   # configuration -> why
    trace: list[dict] = field(default_factory=list)
    trace_title: str = ""
    elapsed_s: float = 0.0
    outputs: list[Path] = field(default_factory=list)


def cap_of(config: BenchConfig) -> float:
    """adaptive-capped's passes-per-token cap, as its client overrides set it (0.30 default)."""
    return float(config.client_overrides.get("adaptive-capped", {}).get("max_passes_per_token", 0.30))


def available_configurations(config: BenchConfig, base: ClientConfig,
                             devices: Sequence[DeviceSpec]) -> tuple[list[str], dict[str, str]]:
    """The configurations this build can run; the others with the reason (e.g. a policy that is
    not in this version), so that the bench still runs and says what it left out."""
    ok, skipped = [], {}
    for name in config.configurations:
        try:
            build_policy(name, client_config(config, base, name, devices[0]))
            ok.append(name)
        except (ValueError, ConfigError) as error:
            skipped[name] = str(error)
    return ok, skipped


def run_bench(config: BenchConfig, channels: Sequence[ChannelProfile], devices: Sequence[DeviceSpec],
              json_path: Path | None = None, plots_dir: Path | None = None,
              progress: bool = True, on_generation: Callable[[GenerationSummary], None] | None = None) -> BenchResult:
    """Every cell, one after the other in this process, or spread over `config.workers`
    processes (bench/matrix/workers.py); then the report."""
    started = time.monotonic()
    result = BenchResult()
    edge = edge_config_of(config)
    names, result.skipped = available_configurations(config, edge.client, devices)
    for name, why in result.skipped.items():
        log.warning("skipping %s: %s", name, why)
    cells = cells_of(config, channels, devices)
    total = config.prompts * len(names) * sum(len(c.offsets) for c in cells)
    bar = tqdm(total=total, unit="gen", disable=not progress, leave=False)

    def emit(g: GenerationSummary) -> None:
        result.generations.append(g)
        if on_generation is not None:
            on_generation(g)
        bar.set_description(f"{g.channel}/{g.device}")
        bar.update(1)

    try:
        if config.workers > 1:
            run_in_workers(config, names, cells, emit)
        else:
            bench = CellBench(config, names)
            try:
                for cell in cells:
                    bench.run(cell, emit)
            finally:
                bench.close()
    finally:
        bar.close()

    result.elapsed_s = time.monotonic() - started
    offsets = {c.profile.name: c.offsets for c in cells}
    return report(result, config, channels, devices, offsets, json_path, plots_dir)


def report(result: BenchResult, config: BenchConfig, channels: Sequence[ChannelProfile],
           devices: Sequence[DeviceSpec], offsets: dict[str, list[float]],
           json_path: Path | None = None, plots_dir: Path | None = None) -> BenchResult:
    """Rows, goals, JSON and plots from result.generations: after a run, or from the
    generations file of an earlier (or stopped) one."""
    from bench.matrix.plots import write_plots
    from bench.matrix.report import write_json

    # cells in the order of the flags (workers finish them in any order): device, then channel
    order = {(p.name, d.name): i for i, (d, p) in enumerate((d, p) for d in devices for p in channels)}
    result.generations.sort(key=lambda g: order.get((g.channel, g.device), len(order)))
    stats = dict(resamples=config.resamples, confidence=config.confidence, seed=config.seed)
    result.rows = rows_of(result.generations, **stats)
    rtt = {p.name: 2.0 * p.delay_ms for p in channels}
    phone = next((d.name for d in devices if d.name == "phone"), devices[-1].name)
    result.goals = goals(result.generations, rtt, lte_channel=config.lte_channel, phone_device=phone,
                         peer_rtt_ms=config.goal_rtt_ms, pipelining_rtt_ms=config.pipelining_goal_rtt_ms,
                         cap_passes_per_token=cap_of(config), **stats)
    result.trace, result.trace_title = _session_trace(result.generations, config.lte_channel)
    if json_path is not None:
        write_json(json_path, result.rows, result.goals, {
            "config": config.model_dump(mode="json"),
            "channels": {p.name: p.model_dump(mode="json") for p in channels},
            "devices": {d.name: d.model_dump(mode="json") for d in devices},
            "offsets": offsets,
            "skipped": result.skipped, "elapsed_s": result.elapsed_s,
            "details": details_of(result.generations),
            "trace": {"title": result.trace_title, "rounds": result.trace}})
        result.outputs.append(json_path)
    if plots_dir is not None and result.rows:
        result.outputs += write_plots(plots_dir, result.rows, result.trace, result.trace_title)
    return result


def _session_trace(generations: Sequence[GenerationSummary], channel: str) -> tuple[list[dict], str]:
    """The adaptive session with the most rounds on the LTE channel (pipelined preferred)."""
    for name in ("adaptive-pipelined", "adaptive"):
        found = [g for g in generations if g.config == name and g.channel == channel and g.rounds_log]
        if found:
            g = max(found, key=lambda g: len(g.rounds_log))
            return g.rounds_log, f"{name} on {channel}, {g.device}, prompt {g.prompt}"
    return [], f"no adaptive session on {channel}"
