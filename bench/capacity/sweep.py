"""`tandem capacity`'s sweep: per (channel, device) cell and configuration, users N = 1, 2, 4, ...
against one server process pinned to one core, closed loop, until the configuration misses the
SLO (then one midpoint between its last pass and first miss), or the largest N asked for.

  server (one core: the Tandem verifier, or vLLM alone)
     ^ gRPC / HTTP
  N links (bench.capacity.links: a ChannelProxy each, at its own trace offset)
     ^
  N users (bench.capacity.users: EdgeClient + ReplayDraft paced at the device's speed,
           or an OpenAI streaming client for vLLM alone), on the other cores

Each configuration gets a fresh server, so its counters and sessions start clean; each point
gets fresh users and links (a device's controller lives across its own requests).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.matrix.cell import build_policy, client_config, edge_config_of
from bench.matrix.config import BenchConfig, DeviceSpec
from bench.matrix.device import ThrottledDraft
from bench.matrix.oracle import target_greedy
from bench.capacity.links import LinkFarm, user_offset
from bench.capacity.options import CLOUD_SETS, POLICY_OF, VLLM, CapacityOptions
from bench.capacity.replay import ReplayDraft, ReplayTable
from bench.capacity.servers import (ServerGroup, cpu_seconds, machine_busy_seconds, pin_self,
                                    server_core_split, start_verifier, start_vllm)
from bench.capacity.stats import (PointRow, ServerReading, TokenCostReading, clearly_misses,
                                  point_row)
from bench.capacity.users import Sample, Window, run_openai_user, run_tandem_user
from sim.netem import ChannelProfile
from tandem.prompts import load_prompts
from edge.client import EdgeClient
from edge.link import make_channel
from edge.runtime import load_draft_runtime
from edge.tokenizer import EdgeTokenizer
from tandem.config import resolve_path

JOIN_GRACE_S = 30.0
SMALL_N = 4   # points with fewer users measure for window_s * SMALL_N / N


@dataclass
class Shared:
    """What every point of the run reads: prompts, the target's greedy references, the replay
    table and the draft's real speed on this machine."""
    prompts: list[list[int]]
    references: list[list[int]]
    reference_texts: list[str]
    table: ReplayTable | None
    real_decode_tok_s: float
    real_prefill_tok_s: float


@dataclass
class CapacityRun:
    rows: list[PointRow] = field(default_factory=list)
    replay_misses: int = 0


def prepare(options: CapacityOptions, bench: BenchConfig, progress: Callable[[str], None]) -> Shared:
    from cloud.runtime.target import TargetRuntime

    edge = edge_config_of(bench)
    tokenizer = EdgeTokenizer(edge.draft.resolved_tokenizer_dir)
    texts = load_prompts(resolve_path(bench.prompts_file), options.prompts, options.prompt_offset,
                         bench.max_prompt_chars)
    prompts = [tokenizer.encode(t) for t in texts]
    progress(f"the target's greedy references for {len(prompts)} prompts")
    target = TargetRuntime(resolve_path(bench_cloud_model(options)), device="cpu", dtype="float32")
    references = [target_greedy(target, p, options.max_tokens) for p in prompts]
    del target
    draft = load_draft_runtime(edge.draft)
    table = None
    if not options.live_draft:
        table = ReplayTable(draft)
        for i, (prompt, reference) in enumerate(zip(prompts, references)):
            progress(f"replay table: prompt {i + 1}/{len(prompts)}")
            table.precompute(prompt, reference, options.replay_depth)
    return Shared(prompts, references, [tokenizer.decode(r) for r in references], table,
                  draft.speed.decode_tok_s, draft.speed.prefill_tok_s)


def bench_cloud_model(options: CapacityOptions) -> Path:
    from cloud.config import CloudConfig
    from tandem.config import load_config

    return load_config(resolve_path(options.cloud_config), CloudConfig).model.path


def device_draft(shared: Shared, device: DeviceSpec, paced: bool, live_source: Callable[[], object]):
    """A user's draft: the replay (or, live, a real draft of its own) paced at the device's
    speed; a device without caps runs at the real draft's speed on this machine. Unpaced for
    cloud-only, which drafts nothing (its client syncs the draft's cache once, which a device
    would not do at all: as in `tandem bench`, that costs nothing)."""
    inner = live_source() if shared.table is None else ReplayDraft(shared.table)
    if not paced:
        return inner
    if shared.table is None:
        if not (device.draft_tokens_per_s or device.prefill_tokens_per_s):
            return inner
        return ThrottledDraft(inner, device.draft_tokens_per_s, device.prefill_tokens_per_s)
    return ThrottledDraft(inner, device.draft_tokens_per_s or shared.real_decode_tok_s,
                          device.prefill_tokens_per_s or shared.real_prefill_tok_s)


PRICE_EVERY_S = 0.5  # how often a point reads the verifiers' price through its window


class _Counter:
    """Tokens committed inside the measuring window, from every user's thread."""

    def __init__(self, window: Window) -> None:
        self.window, self.value, self._lock = window, 0, threading.Lock()

    def __call__(self, n: int) -> None:
        if self.window.measure_from <= time.monotonic() < self.window.measure_until:
            with self._lock:
                self.value += n


def run_point(options: CapacityOptions, bench: BenchConfig, shared: Shared, profile: ChannelProfile,
              device: DeviceSpec, name: str, users: int, server: ServerGroup,
              driver_cores: int) -> tuple[PointRow, list[Sample]]:
    """N users for warm-up + window (+ drain) against `server`: the point's row and the samples
    it was computed from."""
    from edge.config import EdgeConfig

    t0 = time.monotonic()
    window_s = window_for(options, users)
    window = Window(t0 + options.warmup_s, t0 + options.warmup_s + window_s,
                    t0 + options.warmup_s + window_s + options.drain_s, options.think_s)
    samples: list[Sample] = []
    lock = threading.Lock()
    stop = threading.Event()
    counter = _Counter(window)

    def record(sample: Sample) -> None:
        with lock:
            samples.append(sample)

    readings: dict[str, tuple] = {}
    prices: list[tuple[float, float | None]] = []

    def watch_prices(until: float) -> None:
        """The verifiers' price and position cost through the window (Info, every PRICE_EVERY_S)."""
        while (left := until - time.monotonic()) > 0 and not stop.wait(min(PRICE_EVERY_S, left)):
            said = server.prices() if time.monotonic() < until else None
            if said is not None:
                prices.append(said)

    def read(label: str, at: float) -> None:
        if not stop.wait(max(0.0, at - time.monotonic())):
            readings[label] = (time.monotonic(), server.batched_passes(), server.cpu_seconds(),
                               cpu_seconds_self(), machine_busy_seconds(), server.token_totals())

    edge: EdgeConfig = edge_config_of(bench)
    with LinkFarm() as farm:
        addresses = [farm.add(profile, server.for_user(u).host_port, user_offset(profile, u, users),
                              seed=f"{profile.seed}:{u}") for u in range(users)]
        reader = threading.Thread(target=lambda: (read("from", window.measure_from),
                                                  watch_prices(window.measure_until),
                                                  read("until", window.measure_until)), daemon=True)
        if name == VLLM:
            workers = [farm.submit(run_openai_user(
                u, f"http://{host}:{port}", server.model, shared.prompts, shared.reference_texts,
                options.max_tokens, window, record, counter, stop, timeout_s=options.drain_s * 4))
                for u, (host, port) in enumerate(addresses)]
            reader.start()
            _wait_all(lambda t: _all_done(workers, t), window, stop)
            channels = []
        else:
            cc = client_config(bench, edge.client, POLICY_OF.get(name, name), device)
            channels = [make_channel(edge.cloud, f"{host}:{port}") for host, port in addresses]
            clients = [EdgeClient(ch, device_draft(shared, device, name != "cloud-only",
                                                   lambda: load_draft_runtime(edge.draft)),
                                  cc, policy=build_policy(POLICY_OF.get(name, name), cc)) for ch in channels]
            threads = [threading.Thread(target=run_tandem_user, name=f"user-{u}", daemon=True, args=(
                u, client, shared.prompts, shared.references, options.max_tokens, window, record,
                counter, stop)) for u, client in enumerate(clients)]
            for thread in threads:
                thread.start()
            reader.start()
            _wait_all(lambda t: _joined(threads, t), window, stop)
        reader.join(JOIN_GRACE_S)
        for channel in channels:
            channel.close()
    measured = [s for s in samples if window.measure_from <= s.started < window.measure_until]
    reading = _reading(readings, counter.value, window_s, driver_cores, prices)
    return point_row(profile.name, device.name, name, users, measured, reading, options.slo_ttft_s,
                     options.slo_tpot_s, options.extra_tpot_slos), measured


def window_for(options: CapacityOptions, users: int) -> float:
    """A point's measuring window: --window-s, longer for fewer than SMALL_N users so that a
    point has about as many requests (and trace seconds per user) as one with SMALL_N."""
    return options.window_s * max(1.0, SMALL_N / users)


def cpu_seconds_self() -> float | None:
    import os
    return cpu_seconds(os.getpid())


def _all_done(futures: Sequence, timeout_s: float) -> bool:
    from concurrent.futures import wait

    _, pending = wait(futures, timeout=timeout_s)
    return not pending


def _joined(threads: Sequence[threading.Thread], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


def _wait_all(all_done: Callable[[float], bool], window: Window, stop: threading.Event) -> None:
    """Wait for the users until the drain ends, then stop the stragglers (bounded)."""
    if not all_done(max(0.0, window.drain_until - time.monotonic())):
        stop.set()
        all_done(JOIN_GRACE_S)
    stop.set()


def _reading(readings: dict[str, tuple], tokens: int, window_s: float, driver_cores: int,
             prices: Sequence[tuple[float, float | None]] = ()) -> ServerReading:
    costs = [c for _, c in prices if c is not None]
    said = {"price": sum(p for p, _ in prices) / len(prices) if prices else None,
            "position_cost": sum(costs) / len(costs) if costs else None}
    if "from" not in readings or "until" not in readings:
        return ServerReading(window_s=window_s, window_tokens=tokens, driver_cores=driver_cores,
                             **said)
    (t_a, passes_a, cpu_a, self_a, all_a, tokens_a), \
        (t_b, passes_b, cpu_b, self_b, all_b, tokens_b) = readings["from"], readings["until"]

    def delta(a, b):
        return b - a if a is not None and b is not None else None

    verifier, driver = delta(cpu_a, cpu_b), delta(self_a, self_b)
    return ServerReading(window_s=t_b - t_a, window_tokens=tokens,
                         batched_passes=delta(passes_a, passes_b), verifier_cpu_s=verifier,
                         driver_cpu_s=driver, driver_cores=driver_cores,
                         other_cpu_s=max(0.0, all_b - all_a - (verifier or 0.0) - (driver or 0.0)),
                         token_ms=TokenCostReading.between(tokens_a, tokens_b), **said)


def user_counts(options: CapacityOptions) -> list[int]:
    return sorted(set(options.users))


def sweep_config(options: CapacityOptions, bench: BenchConfig, shared: Shared, profile: ChannelProfile,
                 device: DeviceSpec, name: str, log_dir: Path, driver_cores: int,
                 on_row: Callable[[PointRow, list[Sample]], None]) -> Iterator[PointRow]:
    """One configuration's sweep in one cell, on a fresh server: its rows as each is measured
    (the server starts at the first and stops when the sweep ends or is closed)."""
    counts = user_counts(options)
    per_server = -(-max(counts) // options.verifiers)
    server = ServerGroup([])
    try:
        for i in range(options.verifiers):
            core = options.server_cores[i % len(options.server_cores)]
            log = log_dir / f"server-{i}"
            server.servers.append(
                start_vllm(resolve_path(bench_cloud_model(options)), core, log, per_server)
                if name == VLLM else
                start_verifier(resolve_path(options.cloud_config), core, log, per_server,
                               CLOUD_SETS.get(name, ()) + options.cloud_sets))

        def measure(users: int) -> PointRow:
            row, samples = run_point(options, bench, shared, profile, device, name, users, server,
                                     driver_cores)
            on_row(row, samples)
            return row

        last_pass = 0
        for users in counts:
            row = measure(users)
            yield row
            if clearly_misses(row, options.slo_tpot_s) and not options.every_count:
                middle = (last_pass + users) // 2
                if options.refine and last_pass and last_pass < middle < users:
                    yield measure(middle)
                break
            last_pass = users
    finally:
        server.close()


def sweep_cell(sweeps: list[Iterator[PointRow]], interleave: bool) -> list[PointRow]:
    """The cell's configurations' rows: one sweep after another, or interleaved (each user
    count measured for every configuration before the next count; their servers all up, one
    measuring at a time), so that a drift of the machine's speed falls on both sides of a
    comparison alike. Interleaved, the servers not measuring sit idle on their cores (a
    verifier's idle polling: 1-2% of a core), each configuration alike; one that has stopped is
    closed when its turn comes round."""
    rows: list[PointRow] = []
    if not interleave:
        for sweep in sweeps:
            rows += sweep
        return rows
    live = list(sweeps)
    try:
        while live:
            for sweep in list(live):
                row = next(sweep, None)
                if row is None:
                    live.remove(sweep)
                else:
                    rows.append(row)
    finally:
        for sweep in live:
            sweep.close()
    return rows


def run_capacity(options: CapacityOptions, bench: BenchConfig, channels: Sequence[ChannelProfile],
                 devices: Sequence[DeviceSpec], log_dir: Path, progress: Callable[[str], None],
                 on_row: Callable[[PointRow, list[Sample]], None]) -> CapacityRun:
    import torch

    _, driver_cores = server_core_split(options.server_cores)
    pin_self(driver_cores)
    torch.set_num_threads(len(driver_cores))  # the references and the replay table, off the server's core
    shared = prepare(options, bench, progress)
    run = CapacityRun()
    for profile in channels:
        for device in devices:
            def sweep(name: str) -> Iterator[PointRow]:
                progress(f"{profile.name}/{device.name}: {name}")
                cell_log = log_dir / f"{profile.name}-{device.name}-{name}"
                yield from sweep_config(options, bench, shared, profile, device, name, cell_log,
                                        len(driver_cores), on_row)

            run.rows += sweep_cell([sweep(name) for name in options.configs], options.interleave)
    run.replay_misses = shared.table.misses if shared.table is not None else 0
    return run
