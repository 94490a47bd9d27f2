"""The fail-over run of several verifiers behind one daemon: two verifiers (`tandem-cloud
serve` processes), one daemon (`tandem-edge serve`) reaching both through gRPC's own load
balancing or through NGINX, N concurrent greedy streams. While the first verifier serves
sessions it is SIGKILLed, and started again at once; when that wave is done, a second wave of
the same streams runs on both. Each prompt also runs alone first (the output every stream
must equal).

Per request: text, verified tokens, re-opens, moves (re-opens another verifier took) and the
verifier that served it last. Per verifier: sessions opened and context tokens prefilled, from
its Prometheus counters (the killed one's read just before the kill).

  tandem failover --policy ring_hash    # affinity: gRPC hashes the session id
  tandem failover --policy round_robin  # gRPC spreads, no affinity
  tandem failover --proxy               # NGINX (docker/nginx-grpc.conf) in front
  tandem failover --no-kill --cloud-arg=--set --cloud-arg=limits.max_sessions=8
                                        # re-opens from evictions only: where they land
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.load import StreamStats, drive, spawn_system
from bench.processes import ROOT, VerifierProcess, prometheus_values, several
from sim.workload import RequestRecord, advertised_model
from sim.writers import write_json
from tandem.prompts import load_prompts

OPENS = "tandem_verifier_sessions_opened_total"
PREFILL = "tandem_verifier_prefill_tokens_total"
LIVE = "tandem_verifier_sessions"
ROUNDS = "tandem_verifier_rounds_total"
GENERATED = "tandem_verifier_generated_tokens_total"  # cloud runs: a session's progress too
MOVES = "tandem_edge_session_moves_total"
REOPENS = "tandem_edge_session_reopens_total"


@dataclass
class VerifierCounts:
    """One verifier's counters over one wave: sessions opened, context tokens prefilled."""
    opens: int = 0
    prefill_tokens: int = 0

    @staticmethod
    def between(before: dict[str, float], after: dict[str, float]) -> VerifierCounts:
        return VerifierCounts(int(after.get(OPENS, 0) - before.get(OPENS, 0)),
                              int(after.get(PREFILL, 0) - before.get(PREFILL, 0)))


@dataclass
class Wave:
    records: list[RequestRecord]
    verifiers: dict[str, VerifierCounts]   # by verifier name
    moves: int                             # the daemon's session-moves counter over the wave
    reopens: int                           # ... and its session re-opens counter

    def by_verifier(self) -> dict[str, int]:
        """Requests by the verifier that served them last."""
        counts: dict[str, int] = {}
        for record in self.records:
            name = record.tandem.get("verifier", "")
            counts[name] = counts.get(name, 0) + 1
        return counts

    def summary(self) -> dict:
        ok = [r for r in self.records if r.ok]
        tokens = sum(r.completion_tokens for r in ok)
        return {"requests": len(self.records), "ok": len(ok), "tokens": tokens,
                "verified_tokens": sum(r.verified_tokens for r in ok),
                "reopens": self.reopens, "moves": self.moves,
                "moved_requests": sum(1 for r in ok if r.tandem.get("moves", 0)),
                "requests_by_verifier": self.by_verifier(),
                "first_errors": [r.error for r in self.records if not r.ok][:3],
                "verifiers": {name: asdict(c) for name, c in self.verifiers.items()}}


@dataclass
class FailoverRun:
    solo: list[str]
    killed: str                         # the verifier SIGKILLed in the first wave
    killed_live_sessions: int           # sessions it held just before the kill
    first: Wave
    second: Wave
    texts_equal_solo: list[bool] = field(default_factory=list)

    def summary(self) -> dict:
        return {"killed": self.killed, "killed_live_sessions": self.killed_live_sessions,
                "first_wave": self.first.summary(), "second_wave": self.second.summary(),
                "outputs_equal_solo": sum(self.texts_equal_solo),
                "outputs": len(self.texts_equal_solo)}


def _daemon_counts(url: str) -> dict[str, float]:
    page = httpx.get(url + "/metrics", timeout=5.0)
    page.raise_for_status()
    return prometheus_values(page.text)


def _wave(url: str, model: str, prompts: Sequence[str], max_tokens: int) -> list[StreamStats]:
    streams, _ = asyncio.run(drive(url, model, prompts, duration_s=600.0, max_tokens=max_tokens,
                                   max_requests_per_stream=1))
    return streams


def _records(streams: list[StreamStats]) -> list[RequestRecord]:
    return [s.records[0] for s in streams]


def wait_back(url: str, model: str, prompt: str, name: str, timeout_s: float) -> int:
    """Until the daemon serves a request on verifier `name`: a restarted verifier answering on
    its port may still be set aside by the balancer (gRPC until its subchannel reconnects
    after a backoff, NGINX for fail_timeout after its last refused connection). One-token
    requests, each a new session id, so that some hash to it; returns how many were sent."""
    deadline = time.monotonic() + timeout_s
    sent = 0
    while time.monotonic() < deadline:
        sent += 1
        record = _records(_wave(url, model, [prompt], 1))[0]
        if record.ok and record.tandem.get("verifier") == name:
            return sent
    raise TimeoutError(f"the daemon did not reach verifier {name} within {timeout_s} s")


@contextmanager
def two_verifiers(log_dir: Path, cloud_args: Sequence[str] = ()
                  ) -> Iterator[list[VerifierProcess]]:
    """verifier-a and verifier-b, started and ready; stopped on exit."""
    with ExitStack() as stack:
        verifiers = [VerifierProcess(name, log_dir, ["--log-level", "INFO", *cloud_args])
                     for name in ("verifier-a", "verifier-b")]
        for verifier in verifiers:
            verifier.start()
            stack.callback(verifier.stop)
        for verifier in verifiers:
            verifier.wait_ready()
        yield verifiers


def _solo_outputs(url: str, model: str, prompts: Sequence[str], max_tokens: int) -> list[str]:
    """Each prompt's output alone: what the waves' outputs must equal."""
    solo = []
    for prompt in prompts:
        record = _records(_wave(url, model, [prompt], max_tokens))[0]
        if not record.ok:
            raise RuntimeError(f"solo run failed: {record.error}")
        solo.append(record.text)
    return solo


def _await_mid_stream(verifier: VerifierProcess, before: dict, wave: threading.Thread,
                      min_live: int, deadline: float) -> dict:
    """Poll the verifier's own counters until it holds `min_live` sessions mid-stream (the kill
    must land on them): its counters then."""
    while True:
        now = verifier.metrics()
        live = now.get(LIVE, 0)
        # rounds verified and cloud-run tokens: either way its sessions are mid-stream
        steps = sum(now.get(m, 0) - before.get(m, 0) for m in (ROUNDS, GENERATED))
        if live >= min_live and steps >= live:
            return now
        if not wave.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the first wave ended before verifier a held sessions "
                               f"mid-stream (last seen: {live:.0f} live, {steps:.0f} rounds and cloud-run "
                               f"tokens)")
        time.sleep(0.02)


def run_failover(prompts: Sequence[str], max_tokens: int, verifiers: Sequence[VerifierProcess],
                 *, log_dir: Path, policy: str = "ring_hash", proxy: bool = False,
                 solo: Sequence[str] | None = None, kill_when_live: int = 4,
                 kill: bool = True, timeout_s: float = 300.0) -> FailoverRun:
    """The run above on two running verifiers (two_verifiers); `policy`: the daemon's
    cloud.load_balancing (with `proxy` the daemon sees one address: auto). The first verifier
    is killed once it holds at least `kill_when_live` sessions and has answered as many rounds
    or cloud-run tokens as it holds (they are past their Opens, mid-stream; not at all without
    `kill`: then only evictions re-open sessions).
    solo: the prompts' outputs alone, when known (else run here)."""
    from bench.nginx import NginxProxy

    n = len(prompts)
    policy = "auto" if proxy else policy
    with ExitStack() as stack:
        if proxy:
            nginx = NginxProxy([v.address for v in verifiers], log_dir / "nginx")
            nginx.start()
            stack.callback(nginx.stop)
            target = nginx.address
        else:
            target = several([v.address for v in verifiers])
        system = stack.enter_context(spawn_system(
            n, log_dir=log_dir, verifiers=0, cloud_address=target,
            edge_args=["--set", f"cloud.load_balancing={policy}", "--log-level", "INFO"]))
        url = system.url
        model = advertised_model(url)
        if solo is None:
            solo = _solo_outputs(url, model, prompts, max_tokens)

        # First wave: kill verifier a while it serves sessions, start it again at once.
        a, b = verifiers
        before = {v.name: v.metrics() for v in verifiers}
        daemon_before = _daemon_counts(url)
        result: list[list[StreamStats]] = []
        wave = threading.Thread(target=lambda: result.append(_wave(url, model, prompts,
                                                                   max_tokens)))
        wave.start()
        if kill:
            now = _await_mid_stream(a, before[a.name], wave, min(kill_when_live, n),
                                    time.monotonic() + timeout_s)
            live = int(now.get(LIVE, 0))
            a.kill()
            a.start()
        wave.join(timeout_s)
        if wave.is_alive():
            raise TimeoutError("the first wave did not finish")
        if not kill:
            live, now = 0, a.metrics()
        first_counts = {a.name: VerifierCounts.between(before[a.name], now),
                        b.name: VerifierCounts.between(before[b.name], b.metrics())}
        daemon_after = _daemon_counts(url)
        first = Wave(_records(result[0]), first_counts,
                     int(daemon_after.get(MOVES, 0) - daemon_before.get(MOVES, 0)),
                     int(daemon_after.get(REOPENS, 0) - daemon_before.get(REOPENS, 0)))

        # Second wave: both verifiers up again (a restarted: fresh counters).
        if kill:
            a.wait_ready()
            wait_back(url, model, prompts[0], a.name, timeout_s)
        before = {v.name: v.metrics() for v in verifiers}
        records = _records(_wave(url, model, prompts, max_tokens))
        daemon_end = _daemon_counts(url)
        second = Wave(records, {v.name: VerifierCounts.between(before[v.name], v.metrics())
                                for v in verifiers},
                      int(daemon_end.get(MOVES, 0) - daemon_after.get(MOVES, 0)),
                      int(daemon_end.get(REOPENS, 0) - daemon_after.get(REOPENS, 0)))
    equal = [r.text == s for wave_ in (first, second) for r, s in zip(wave_.records, solo)]
    return FailoverRun(list(solo), a.name if kill else "", live, first, second, equal)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem failover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="ring_hash",
                        choices=("ring_hash", "round_robin", "pick_first"))
    parser.add_argument("--proxy", action="store_true", help="NGINX in front of the verifiers")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--cloud-arg", action="append", default=[],
                        help="extra argument for both tandem-cloud serve (repeatable)")
    parser.add_argument("--no-kill", action="store_true", help=(
        "kill nothing: only evictions re-open sessions (with --cloud-arg=--set "
        "--cloud-arg=limits.max_sessions=N below the streams each verifier gets)"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="keep the processes' logs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    prompts = load_prompts(ROOT / "models/prompts/heldout.jsonl", args.streams, 0, max_chars=300)
    with tempfile.TemporaryDirectory(prefix="tandem-failover-") as folder:
        log_dir = args.log_dir or Path(folder)
        with two_verifiers(log_dir, args.cloud_arg) as verifiers:
            run = run_failover(prompts, args.max_tokens, verifiers, log_dir=log_dir,
                               policy=args.policy, proxy=args.proxy, kill=not args.no_kill)
    summary = {"policy": "nginx hash consistent" if args.proxy else args.policy,
               **run.summary()}
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        write_json(args.json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
