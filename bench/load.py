"""`tandem load`: N concurrent streams through one edge daemon against one verifier (or
several: `--verifiers V`, balanced by the daemon's gRPC channel), for a bounded time, each a
separate process so that memory is measured per process.

  verifier  (tandem-cloud serve, its own process, 127.0.0.1:free port; V of them with
     ^ gRPC  --verifiers V, the daemon's --cloud an ipv4: list of them)
  daemon    (tandem-edge serve, its own process, pool_size = N, HTTP on a free port)
     ^ HTTP, OpenAI API, streamed
  N streams (this process: asyncio + httpx; each sends one request after another until the
             duration is up; stream i always sends prompt offset + i, so outputs are comparable)

Reported: tokens/s in total (all tokens / wall) and per stream (its tokens / wall), p50 and p99
of TTFT and of time per output token (TPOT, tandem.metrics.tpot, per request), the verifier's
batch sizes over the run (from Info.batches, before and after), and the peak RSS (VmHWM) of the
verifier, the daemon and this process. The server's side: target passes per token (batched
passes / tokens) and verified tokens per CPU-second of the verifier process (goodput per core,
from /proc/PID/stat); `--compare-cloud-only` runs the same streams again against a fresh
verifier with k = 0 rounds (the target decoding alone, one pass per token) and prints both.
With several verifiers the batch figures and CPU seconds add up over all of them, and the jobs
each one served show the spread. `--cloud` / `--url` drive an already running verifier (or
several, comma-separated) and daemon instead (their memory is then reported only if their PIDs
are given).
"""
from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import httpx

from bench.processes import (VerifierProcess, cloud_info, command, free_port, launch_in,
                             several, wait_until)
from sim.workload import RequestRecord, one_request, advertised_model
from sim.writers import write_json
from tandem import metrics
from tandem.prompts import load_prompts


@dataclass
class StreamStats:
    index: int
    requests: int = 0
    errors: int = 0
    tokens: int = 0
    texts: list[str] = field(default_factory=list)   # one per finished request, in order
    records: list[RequestRecord] = field(default_factory=list)


@dataclass
class LoadReport:
    streams: int
    duration_s: float
    wall_s: float
    requests: int
    errors: int
    tokens: int
    verified_tokens_per_s: float          # all streams, verified tokens / wall
    local_tokens_per_s: float             # all streams, unverified tokens / wall (never added in)
    per_stream_tokens_per_s: list[float]  # verified tokens / wall, per stream
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    tpot_ms_p50: float | None
    tpot_ms_p99: float | None
    verified_share: float
    batch_passes: int
    batch_mean: float
    batch_largest: int
    batch_size_counts: list[int]
    peak_rss_mb: dict[str, float]
    first_errors: list[str] = field(default_factory=list)
    verified_tokens: int = 0
    target_passes_per_token: float | None = None   # batched passes / tokens
    verifier_cpu_s: float | None = None            # CPU seconds the verifier used in the run
    verified_tokens_per_core_s: float | None = None  # verified tokens / verifier_cpu_s
    # Rounds and prefills each verifier served in the run (Info.batches.rounds, by
    # Info.verifier): how the balancer spread the sessions.
    jobs_per_verifier: dict[str, int] = field(default_factory=dict)

    def table(self) -> str:
        per = self.per_stream_tokens_per_s
        lines = [
            f"streams {self.streams}, {self.wall_s:.1f} s, {self.requests} requests, "
            f"{self.errors} errors, {self.tokens} tokens, {self.verified_share:.1%} verified",
            f"verified tokens/s: total {self.verified_tokens_per_s:.1f}, per stream "
            f"min {min(per, default=0):.1f} / median {_median(per):.1f} / max {max(per, default=0):.1f}",
            f"local (unverified) tokens/s: {self.local_tokens_per_s:.1f}",
            f"TTFT ms: p50 {_fmt(self.ttft_ms_p50)}  p99 {_fmt(self.ttft_ms_p99)}; "
            f"TPOT ms: p50 {_fmt(self.tpot_ms_p50)}  p99 {_fmt(self.tpot_ms_p99)}",
            f"verifier batches: {self.batch_passes} passes, mean {self.batch_mean:.2f} jobs, "
            f"largest {self.batch_largest}",
            "peak RSS MB: " + ", ".join(f"{name} {mb:.0f}" for name, mb in self.peak_rss_mb.items()),
            f"server: {_fmt(self.target_passes_per_token, 3)} target passes per token, "
            f"{_fmt(self.verified_tokens_per_core_s)} verified tokens per verifier CPU-second "
            f"({_fmt(self.verifier_cpu_s)} CPU-s)",
        ]
        if len(self.jobs_per_verifier) > 1:
            lines.append("jobs per verifier: " + ", ".join(
                f"{name} {jobs}" for name, jobs in self.jobs_per_verifier.items()))
        return "\n".join(lines)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a live process has used; None when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_table(tandem: LoadReport, cloud_only: LoadReport) -> str:
    """The server's side of the same streams, served by Tandem and by the target alone."""
    rows = [("tandem", tandem), ("cloud-only (k = 0)", cloud_only)]
    lines = ["| serving | verified tokens/s | target passes / token | "
             "verified tok / verifier CPU-s |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {r.verified_tokens_per_s:.1f} | "
              f"{_fmt(r.target_passes_per_token, 3)} | "
              f"{_fmt(r.verified_tokens_per_core_s)} |" for name, r in rows]
    return "\n".join(lines)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100), at least 1
    return ordered[int(rank) - 1]


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set) of a live process, in MB; None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


# --- the processes ------------------------------------------------------------------------------
@dataclass
class System:
    cloud_address: str            # the gRPC target the daemon uses (several: an ipv4: list)
    url: str
    pids: dict[str, int]
    verifiers: list[VerifierProcess] = field(default_factory=list)

    @property
    def cloud_addresses(self) -> list[str]:
        return [v.address for v in self.verifiers] or [self.cloud_address]


@contextmanager
def spawn_system(streams: int, *, log_dir: Path, cloud_args: Sequence[str] = (),
                 edge_args: Sequence[str] = (), start_timeout_s: float = 180.0,
                 verifiers: int = 1, cloud_address: str | None = None):
    """Start `verifiers` verifiers and a daemon (pool_size = streams, all verifiers as one
    gRPC target: cloud.load_balancing picks among them) as child processes; yield System; stop
    them all (SIGTERM, then SIGKILL) on exit. cloud_address: a gRPC target of verifiers
    running already (none is started)."""
    http_port = free_port()
    env = dict(os.environ)
    with ExitStack() as stack:
        names = [] if cloud_address else ["verifier"] if verifiers == 1 else \
            [f"verifier-{i + 1}" for i in range(verifiers)]
        clouds = [VerifierProcess(name, log_dir, ["--log-level", "WARNING", *cloud_args])
                  for name in names]
        for cloud in clouds:
            cloud.start(env)
            stack.callback(cloud.stop)
        for cloud in clouds:
            cloud.wait_ready(start_timeout_s)
        cloud_address = cloud_address or several([cloud.address for cloud in clouds])
        daemon = launch_in(stack, [command("tandem-edge"), "serve", "--host", "127.0.0.1", "--port",
                                   str(http_port), "--cloud", cloud_address,
                                   "--set", f"daemon.pool_size={streams}",
                                   "--set", f"daemon.max_waiting={max(64, streams)}", *edge_args],
                           log_dir / "daemon.log", env=env)
        url = f"http://127.0.0.1:{http_port}"
        wait_until(lambda: httpx.get(url + "/healthz", timeout=1.0).status_code == 200, daemon,
                   "the daemon", start_timeout_s, log_dir / "daemon.log")
        pids = {cloud.name: cloud.process.pid for cloud in clouds} | {"daemon": daemon.pid}
        yield System(cloud_address, url, pids, clouds)


# --- the streams ----------------------------------------------------------------------------------
async def drive(url: str, model: str, prompts: Sequence[str], *, duration_s: float,
                max_tokens: int, temperature: float = 0.0, request_timeout_s: float = 120.0,
                max_requests_per_stream: int | None = None) -> tuple[list[StreamStats], float]:
    """len(prompts) streams; stream i sends prompts[i] again and again until duration_s has
    passed (a request that started in time finishes) or it sent max_requests_per_stream."""
    endpoint = url.rstrip("/") + "/v1/completions"
    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=len(prompts))
    t0 = time.monotonic()
    deadline = t0 + duration_s
    async with httpx.AsyncClient(timeout=request_timeout_s, limits=limits) as client:
        async def stream(index: int, prompt: str) -> StreamStats:
            stats = StreamStats(index)
            while time.monotonic() < deadline and (max_requests_per_stream is None or
                                                    stats.requests < max_requests_per_stream):
                body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                        "temperature": temperature, "seed": index, "stream": True,
                        "stream_options": {"include_usage": True}, "ignore_eos": True}
                record = await one_request(client, endpoint, body, stats.requests, t0)
                stats.requests += 1
                stats.records.append(record)
                if record.ok:
                    stats.tokens += record.completion_tokens
                    stats.texts.append(record.text)
                else:
                    stats.errors += 1
            return stats

        results = await asyncio.gather(*(stream(i, p) for i, p in enumerate(prompts)))
    return list(results), time.monotonic() - t0


def load_report(streams: list[StreamStats], wall_s: float, duration_s: float,
              batches_before, batches_after, rss: dict[str, float],
              verifier_cpu_s: float | None = None,
              jobs_per_verifier: dict[str, int] | None = None) -> LoadReport:
    records = [r for s in streams for r in s.records]
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_s * 1000.0 for r in ok if r.ttft_s is not None]
    tpots = [metrics.tpot(r.wall_s, r.ttft_s, r.completion_tokens) * 1000.0
             for r in ok if r.ttft_s is not None and r.completion_tokens > 1]
    verified = sum(r.verified_tokens for r in ok)
    emitted = verified + sum(r.local_tokens for r in ok)
    before = list(batches_before.size_counts) if batches_before is not None else []
    after = list(batches_after.size_counts) if batches_after is not None else []
    counts = [a - (before[i] if i < len(before) else 0) for i, a in enumerate(after)]
    passes = sum(counts)
    tokens = sum(s.tokens for s in streams)
    return LoadReport(
        streams=len(streams), duration_s=duration_s, wall_s=wall_s, requests=len(records),
        errors=len(records) - len(ok), tokens=tokens,
        verified_tokens_per_s=verified / wall_s if wall_s > 0 else 0.0,
        local_tokens_per_s=(emitted - verified) / wall_s if wall_s > 0 else 0.0,
        per_stream_tokens_per_s=[sum(r.verified_tokens for r in s.records if r.ok) / wall_s
                                 if wall_s > 0 else 0.0 for s in streams],
        ttft_ms_p50=percentile(ttfts, 50), ttft_ms_p99=percentile(ttfts, 99),
        tpot_ms_p50=percentile(tpots, 50), tpot_ms_p99=percentile(tpots, 99),
        verified_share=verified / emitted if emitted else 0.0,
        batch_passes=passes,
        batch_mean=sum((i + 1) * n for i, n in enumerate(counts)) / passes if passes else 0.0,
        batch_largest=max((i + 1 for i, n in enumerate(counts) if n), default=0),
        batch_size_counts=counts, peak_rss_mb=rss,
        first_errors=[r.error or "" for r in records if not r.ok][:5],
        verified_tokens=verified,
        target_passes_per_token=passes / tokens if tokens and batches_after is not None
        else None,
        verifier_cpu_s=verifier_cpu_s,
        verified_tokens_per_core_s=verified / verifier_cpu_s if verifier_cpu_s else None,
        jobs_per_verifier=jobs_per_verifier or {})


def run_load(*, streams: int, duration_s: float, max_tokens: int, temperature: float,
             prompts_file: Path, prompt_offset: int = 0, url: str | None = None,
             cloud: str | None = None, pids: dict[str, int] | None = None,
             log_dir: Path = Path("out/load"), cloud_args: Sequence[str] = (),
             edge_args: Sequence[str] = (), verifiers: int = 1,
             ) -> tuple[LoadReport, list[StreamStats]]:
    """cloud: with url, the running verifiers' HOST:PORT, comma-separated (for batch sizes);
    verifiers: how many to start (without url), all behind the one daemon."""
    prompts = load_prompts(prompts_file, streams, prompt_offset, max_chars=400)
    with ExitStack() as stack:
        if url is None:
            system = stack.enter_context(spawn_system(
                streams, log_dir=log_dir, cloud_args=cloud_args, edge_args=edge_args,
                verifiers=verifiers))
            url, clouds, pids = system.url, system.cloud_addresses, system.pids
        else:
            clouds = cloud.split(",") if cloud else []
        pids = dict(pids or {})
        before = _batches(clouds)
        model = advertised_model(url)
        cpu_before = _verifiers_cpu_s(pids)
        results, wall_s = asyncio.run(drive(url, model, prompts, duration_s=duration_s,
                                            max_tokens=max_tokens, temperature=temperature))
        after = _batches(clouds)
        cpu_after = _verifiers_cpu_s(pids)
        verifier_cpu_s = cpu_after - cpu_before if cpu_before is not None and \
            cpu_after is not None else None
        rss = {name: mb for name, pid in pids.items() if (mb := peak_rss_mb(pid)) is not None}
        rss["load generator"] = peak_rss_mb(os.getpid()) or 0.0
    jobs = {name: n - before.jobs.get(name, 0) for name, n in after.jobs.items()} \
        if before is not None and after is not None else None
    return load_report(results, wall_s, duration_s, before, after, rss, verifier_cpu_s,
                     jobs), results


@dataclass
class Batches:
    """Info.batches of every verifier, added up; jobs: each verifier's rounds + prefills."""
    size_counts: list[int]
    jobs: dict[str, int]


def _batches(clouds: Sequence[str]) -> Batches | None:
    if not clouds:
        return None
    counts: list[int] = []
    jobs: dict[str, int] = {}
    for address in clouds:
        try:
            info = cloud_info(address)
        except grpc.RpcError:
            return None
        sizes = list(info.batches.size_counts)
        counts += [0] * (len(sizes) - len(counts))
        for i, n in enumerate(sizes):
            counts[i] += n
        jobs[info.verifier or address] = info.batches.rounds
    return Batches(counts, jobs)


def _verifiers_cpu_s(pids: dict[str, int]) -> float | None:
    """CPU seconds of every verifier process in pids (named verifier, verifier-1, ...)."""
    seconds = [cpu_seconds(pid) for name, pid in pids.items() if name.startswith("verifier")]
    return None if not seconds or None in seconds else sum(seconds)


def write_report(path: Path, report: LoadReport) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, asdict(report))
