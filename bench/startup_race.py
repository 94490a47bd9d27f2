"""The start-up race, measured: a verifier and an edge daemon started together with the shipped
configs, requests sent as soon as the daemon first answers `/v1/models`.

  tandem startup-race [--requests 200] [--concurrency 32] [--busy 2]
                      [--order together|daemon-first|verifier-ready] [--temperature T]

`together` starts the daemon and the verifier at once (what `docker compose up` does);
`daemon-first` starts the verifier only once the daemon answers, so every request surely
arrives before the verifier can serve it; `verifier-ready` starts both at once but sends
only once the daemon's /health says the verifier is reached, so what is measured is the
rounds, not the verifier's start-up (which a busy CPU can stretch past offline_wait_s). `--busy N` keeps N busy-loop processes running on
the CPU the whole time. Prints how many responses were fully verified (the
x-tandem-verified-fraction header), the errors, and what /health said before the verifier was
reached. The shipped default (client.offline: wait) makes such requests wait for the verifier
instead of going local.
"""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.processes import ROOT, command, free_port, launch_in, stop_process, wait_until
from edge.daemon.responses import VERIFIED_FRACTION_HEADER
from tandem.prompts import load_prompts

PROMPTS = ROOT / "models/prompts/heldout.jsonl"
BUSY_LOOP = "while True:\n    pass\n"


@dataclass
class RaceReport:
    requests: int
    errors: int
    fully_verified: int
    min_verified_fraction: float
    health_before_verifier: list[int] = field(default_factory=list)  # HTTP status codes seen
    wall_s: float = 0.0
    first_errors: list[str] = field(default_factory=list)

    def table(self) -> str:
        return (f"{self.fully_verified} of {self.requests} fully verified, {self.errors} errors, "
                f"lowest verified fraction {self.min_verified_fraction:.3f}, all answered in "
                f"{self.wall_s:.1f} s; /health before the verifier was reached: "
                f"{sorted(set(self.health_before_verifier)) or 'not asked'}")


def busy_loops(stack: ExitStack, n: int) -> list[int]:
    """n processes that keep a core busy until the stack closes; their PIDs."""
    pids = []
    for _ in range(n):
        process = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
        stack.callback(stop_process, process)
        pids.append(process.pid)
    return pids


async def _send(url: str, prompts: list[str], concurrency: int, max_tokens: int,
                temperature: float, timeout_s: float) -> list[tuple[float | None, str]]:
    """(verified fraction or None, error) per request, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        async def one(i: int, prompt: str) -> tuple[float | None, str]:
            async with gate:
                body = {"model": "tandem-draft", "prompt": prompt, "max_tokens": max_tokens,
                        "temperature": temperature, "seed": i}
                try:
                    response = await client.post(url + "/v1/completions", json=body)
                except httpx.HTTPError as error:
                    return None, f"{type(error).__name__}: {error}"
                if response.status_code != 200:
                    return None, f"HTTP {response.status_code}: {response.text[:200]}"
                return float(response.headers[VERIFIED_FRACTION_HEADER]), ""
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def run_race(*, requests: int, concurrency: int, max_tokens: int = 16, temperature: float = 0.0,
             order: str = "together", busy: int = 0, log_dir: Path,
             edge_args: tuple[str, ...] = (), start_timeout_s: float = 180.0,
             request_timeout_s: float = 120.0) -> RaceReport:
    cloud_port, http_port = free_port(), free_port()
    url = f"http://127.0.0.1:{http_port}"
    prompts = load_prompts(PROMPTS, requests, 0, 2000)
    with ExitStack() as stack:
        busy_loops(stack, busy)

        def start_verifier() -> subprocess.Popen:
            return launch_in(stack, [command("tandem-cloud"), "serve", "--config",
                                     "configs/cloud.yaml", "--host", "127.0.0.1", "--port",
                                     str(cloud_port), "--log-level", "WARNING"],
                             log_dir / "verifier.log")

        daemon = launch_in(stack, [command("tandem-edge"), "serve", "--config",
                                   "configs/edge.yaml", "--host", "127.0.0.1", "--port",
                                   str(http_port), "--cloud", f"127.0.0.1:{cloud_port}",
                                   "--set", "daemon.max_waiting=100000", *edge_args],
                           log_dir / "daemon.log")
        if order != "daemon-first":
            start_verifier()
        wait_until(lambda: httpx.get(url + "/v1/models", timeout=1.0).status_code == 200,
                    daemon, "the daemon", start_timeout_s, log_dir / "daemon.log")
        health = [httpx.get(url + "/health", timeout=5.0).status_code]
        if order == "verifier-ready":
            wait_until(lambda: httpx.get(url + "/health", timeout=1.0).status_code == 200,
                       daemon, "the daemon to reach the verifier", start_timeout_s,
                       log_dir / "daemon.log")
        t0 = time.monotonic()
        loop = asyncio.new_event_loop()
        try:
            pending = loop.create_task(_send(url, prompts, concurrency, max_tokens, temperature,
                                             request_timeout_s))
            if order == "daemon-first":
                # Let the requests reach the daemon before the verifier exists at all.
                loop.run_until_complete(asyncio.sleep(0.5))
                health.append(httpx.get(url + "/health", timeout=5.0).status_code)
                start_verifier()
            results = loop.run_until_complete(pending)
        finally:
            loop.close()
        wall_s = time.monotonic() - t0
    fractions = [f for f, _ in results if f is not None]
    errors = [e for _, e in results if e]
    return RaceReport(requests=len(results), errors=len(errors),
                      fully_verified=sum(f == 1.0 for f in fractions),
                      min_verified_fraction=min(fractions, default=0.0),
                      health_before_verifier=health, wall_s=wall_s, first_errors=errors[:5])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem startup-race", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--order", choices=("together", "daemon-first", "verifier-ready"), default="together")
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes meanwhile")
    parser.add_argument("--log-dir", type=Path, default=ROOT / "out/startup_race")
    args = parser.parse_args(argv)
    report = run_race(requests=args.requests, concurrency=args.concurrency,
                      max_tokens=args.max_tokens, temperature=args.temperature,
                      order=args.order, busy=args.busy, log_dir=args.log_dir)
    print(report.table())
    for error in report.first_errors:
        print("error:", error)
    return 0 if report.errors == 0 and report.fully_verified == report.requests else 1


if __name__ == "__main__":
    sys.exit(main())
