"""Verifier benchmark: per-round verify latency and goodput (verified tokens per second) with
1, 4, 16 and 64 concurrent sessions, torch backend vs vLLM backend vs target-only
autoregressive decoding of the same sessions, in one run; plus the cost of a re-open (vLLM's
prefix cache) and per-session KV memory.

  .venv-vllm/bin/tandem verifier-bench [--sessions 1,4,16,64] [--rounds 6] [--k 4]
                                       [--backends torch,vllm] [--json out/verifier.json]

Runs in .venv-vllm (scripts/bootstrap.sh --vllm), which has both backends; without vLLM it
measures the torch backend alone and says so.

The workload drives the verifier engine (cloud.engine.Verifier: session table, backend, the
acceptance test) directly from one thread per session, closed loop (no network, no draft
model: this measures the verifier). Each session's context is a held-out prompt; its blocks
are made from the target's own greedy continuation with a seeded number of right tokens
(0..k) followed by a wrong one, so acceptance is realistic and every verdict is checked: the
engine must accept exactly the right prefix and return the target's next token.

Target-only baselines produce the same number of tokens per session: torch as k = 0 rounds
(one token per batched pass, the batcher grouping sessions), vLLM with its own decode path
(one request per session, max_tokens tokens, continuous batching).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from cloud.config import BatchSettings, LimitSettings, ModelSettings, VllmSettings
from cloud.engine import DraftRequest, OpenRequest, Verifier
from sim.writers import write_json
from tandem.config import REPO_ROOT
from tandem.sampling import SamplingParams

TARGET = REPO_ROOT / "models/tandem-target"
PROMPTS = REPO_ROOT / "models/prompts/heldout.jsonl"
MAX_PROMPT = 256  # tokens of context per session (the held-out prompts vary in length)
REOPEN_CONTEXTS = 8


@dataclass
class GoodputRow:
    backend: str          # torch | vllm | torch-ar | vllm-ar
    sessions: int
    rounds: int           # rounds (or target-only passes) in the phase
    tokens: int           # verified tokens (or generated ones, target-only)
    wall_s: float
    goodput_tok_s: float
    round_ms_mean: float  # per-round verify latency seen by a session (queue + pass + verify)
    round_ms_p50: float
    round_ms_p90: float
    kv_bytes_per_session: float  # see memory_note()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem verifier-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", default="1,4,16,64")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per session")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per block")
    parser.add_argument("--backends", default="torch,vllm")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = default")
    parser.add_argument("--max-batch", type=int, default=BatchSettings().max_batch,
                        help="torch backend: most sessions in one pass (batch.max_batch)")
    parser.add_argument("--speculative-only", action="store_true", help=(
        "skip the target-only rows and the re-open measurement (e.g. to profile the rounds)"))
    parser.add_argument("--json", type=Path, default=REPO_ROOT / "out/bench-verifier.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    levels = [int(n) for n in args.sessions.split(",")]
    backends = args.backends.split(",")
    if "vllm" in backends:
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("vLLM is not installed here (run in .venv-vllm): torch backend only",
                  file=sys.stderr)
            backends = [b for b in backends if b != "vllm"]

    # Eight contexts more than sessions: never seen before the re-open measurement, so the
    # first open of each is cold for vLLM's prefix cache.
    contexts, continuations = _workload(max(levels) + REOPEN_CONTEXTS,
                                        args.rounds * (args.k + 1) + 1)
    fresh = contexts[max(levels):]
    rows: list[GoodputRow] = []
    reopen: dict[str, dict[str, float]] = {}
    one_pass: dict[str, float] = {}
    for name in backends:
        engine = _engine(name, max(levels), args.max_batch)
        try:
            if name == "vllm":
                print(f"vllm: scoring {engine.runtime.info().details['scoring']}", flush=True)
            if name == "torch":
                one_pass = _one_pass_ms(engine, contexts[0], continuations[0], args.k)
                print(f"torch, 1 session, rounds paired with bare passes: round p50 "
                      f"{one_pass['round_ms']:.1f} ms, one target pass of the same k + 1 tokens "
                      f"{one_pass['pass_ms']:.1f} ms: {one_pass['ratio']:.2f}x (medians of "
                      f"{one_pass['passes']})", flush=True)
            for n in levels:
                rows.append(_speculative(engine, name, contexts[:n], continuations[:n],
                                         args.rounds, args.k))
                print(_format(rows[-1]), flush=True)
                if args.speculative_only:
                    continue
                produced = rows[-1].tokens // n
                rows.append(_target_only(engine, name, contexts[:n], continuations[:n],
                                         produced))
                print(_format(rows[-1]), flush=True)
            if args.speculative_only:
                continue
            reopen[name] = _reopen_cost(engine, fresh)
            print(f"{name}: open {reopen[name]['open_ms']:.1f} ms, re-open of the same context "
                  f"{reopen[name]['reopen_ms']:.1f} ms", flush=True)
        finally:
            engine.shutdown()
    report = {"rows": [asdict(r) for r in rows], "reopen": reopen,
              "crossover": _crossover(rows), "memory_note": memory_note(),
              "k": args.k, "rounds": args.rounds, "max_batch": args.max_batch,
              "one_pass": one_pass, "goals": _goals(rows, one_pass)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.json, report)
    print(_table(rows))
    print(f"crossover: {report['crossover']}")
    for line in report["goals"]:
        print(line)
    print(f"written: {args.json}")
    return 0


def _workload(n: int, length: int) -> tuple[list[list[int]], list[list[int]]]:
    """n held-out contexts and the target's greedy continuation of each (length tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()]
    contexts = [tokenizer(p)["input_ids"][-MAX_PROMPT:] for p in prompts[:n]]
    config = GenerationConfig(do_sample=False, max_new_tokens=length, min_new_tokens=0,
                              eos_token_id=None, pad_token_id=0)
    continuations = []
    with torch.inference_mode():
        for ids in contexts:
            out = model.generate(torch.tensor([ids]), generation_config=config)
            continuations.append(out[0, len(ids):].tolist())
    return contexts, continuations


def _engine(name: str, sessions: int, max_batch: int) -> Verifier:
    limits = LimitSettings(max_sessions=max(sessions, 8), kv_budget_bytes=2**31)
    batch = BatchSettings(max_batch=max_batch)
    model = ModelSettings(path=TARGET, device="auto", backend="torch" if name == "torch"
                          else "vllm")
    if name == "torch":
        from cloud.runtime.target import TargetRuntime
        target = TargetRuntime(TARGET, device="auto")
    else:
        from cloud.runtime.vllm_backend import VllmBackend
        target = VllmBackend(model, VllmSettings())
    return Verifier(target, limits, batch)


def _one_pass_ms(engine: Verifier, context: list[int], continuation: list[int], k: int,
                 rounds: int = 21) -> dict:
    """What a 1-session round costs over the bare target pass it needs: rounds of one session
    (its block fully right, so every round has k + 1 new tokens), each followed at once by the
    same pass run on the runtime directly (no batcher, no test, a second state of the same
    length), so both see the same machine load. Medians of `rounds`."""
    runtime = engine.runtime.runtime  # the TorchBackend's TargetRuntime
    session = engine.open(OpenRequest("", "", _fingerprint(engine), list(context),
                                      SamplingParams())).session
    bare = runtime.new_state()
    runtime.score(bare, context[:-1])
    start, round_ms, pass_ms = len(context), [], []
    tokens = [context[-1]] + continuation
    for r in range(rounds):
        pos = start - len(context)
        if pos + k + 1 > len(continuation):
            break
        began = time.perf_counter()
        result = engine.draft(session, DraftRequest(r + 1, start, continuation[pos: pos + k], []))
        round_ms.append((time.perf_counter() - began) * 1000.0)
        assert result.verdict.accepted == k, "the block is the target's own continuation"
        began = time.perf_counter()
        runtime.score(bare, tokens[pos: pos + k + 1])
        pass_ms.append((time.perf_counter() - began) * 1000.0)
        runtime.rollback(bare, start + k)   # the round keeps k of its k + 1 positions, too
        start += k + 1
    engine.close(session, "bench")
    bare.release()
    round_p50, pass_p50 = statistics.median(round_ms), statistics.median(pass_ms)
    return {"round_ms": round(round_p50, 2), "pass_ms": round(pass_p50, 2),
            "ratio": round(round_p50 / pass_p50, 3), "passes": len(round_ms)}


def _goals(rows: list[GoodputRow], one_pass: dict) -> list[str]:
    """Issue 18's done-when lines, from this run's rows."""
    by = {(r.backend, r.sessions): r for r in rows}
    lines = []
    top = max((r.sessions for r in rows), default=0)
    alone = by.get(("vllm-ar", top))
    best = max((by[b, top] for b in ("torch", "vllm") if (b, top) in by),
               key=lambda r: r.goodput_tok_s, default=None)
    if best and alone:
        lines.append(f"{top} sessions: best backend {best.backend} {best.goodput_tok_s:.0f} "
                     f"verified tok/s = {best.goodput_tok_s / alone.goodput_tok_s:.2f}x vLLM "
                     f"alone's {alone.goodput_tok_s:.0f} generated tok/s (goal >= 2); round "
                     f"p50 {best.round_ms_p50:.0f} ms (goal <= 150)")
    if one_pass:
        lines.append(f"1 session: torch round p50 {one_pass['round_ms']:.1f} ms = "
                     f"{one_pass['ratio']:.2f}x one target pass of the same tokens "
                     f"({one_pass['pass_ms']:.1f} ms, paired round by round; goal <= 1.3)")
    return lines


def _fingerprint(engine: Verifier) -> str:
    return engine.runtime.fingerprint


def _run_threads(n: int, work) -> float:
    barrier = threading.Barrier(n + 1)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=300)
            work(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    barrier.wait(timeout=300)
    started = time.perf_counter()
    for thread in threads:
        thread.join(timeout=1800)
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    return wall


def _speculative(engine: Verifier, name: str, contexts, continuations, rounds: int,
                 k: int) -> GoodputRow:
    n = len(contexts)
    sessions = [engine.open(OpenRequest("", "", _fingerprint(engine), list(ids),
                                        SamplingParams())).session for ids in contexts]
    latencies: list[list[float]] = [[] for _ in range(n)]
    tokens = [0] * n
    lengths = [0] * n

    def work(i: int) -> None:
        rng = random.Random(i)
        session, ref, pos = sessions[i], continuations[i], 0
        start = len(contexts[i])
        for r in range(rounds):
            right = rng.randint(0, k)
            block = ref[pos: pos + right]
            if right < k:  # a wrong token, then whatever follows
                block += [(ref[pos + right] + 1) % engine.limits.vocab_size]
                block += ref[pos + right + 1: pos + k]
            began = time.perf_counter()
            result = engine.draft(session, DraftRequest(r + 1, start, block, []))
            latencies[i].append((time.perf_counter() - began) * 1000.0)
            verdict = result.verdict
            if (verdict.accepted, verdict.token) != (right, ref[pos + right]):
                raise AssertionError(f"{name}: session {i} round {r}: verdict "
                                     f"{verdict.accepted, verdict.token}, the target's "
                                     f"{right, ref[pos + right]}")
            pos += right + 1
            start += right + 1
            tokens[i] += right + 1
        lengths[i] = start

    wall = _run_threads(n, work)
    for session in sessions:
        engine.close(session, "bench")
    return _row(name, n, n * rounds, sum(tokens), wall, [x for l in latencies for x in l],
                _kv_per_session(engine, name, lengths))


def _target_only(engine: Verifier, name: str, contexts, continuations, produced: int) -> GoodputRow:
    n = len(contexts)
    latencies: list[list[float]] = [[] for _ in range(n)]
    lengths = [len(c) + produced for c in contexts]
    if name == "vllm":
        backend = engine.runtime

        def work(i: int) -> None:
            began = time.perf_counter()
            out = backend.generate_greedy(contexts[i], produced).result()
            latencies[i].append((time.perf_counter() - began) * 1000.0 / produced)
            if out != continuations[i][:produced]:  # reported, not fatal: a baseline
                print(f"vllm-ar: session {i} differs from transformers' greedy", file=sys.stderr)
    else:
        sessions = [engine.open(OpenRequest("", "", _fingerprint(engine), list(ids),
                                            SamplingParams())).session for ids in contexts]

        def work(i: int) -> None:
            start = len(contexts[i])
            for r in range(produced):
                began = time.perf_counter()
                result = engine.draft(sessions[i], DraftRequest(r + 1, start + r, [], []))
                latencies[i].append((time.perf_counter() - began) * 1000.0)
                if result.verdict.token != continuations[i][r]:
                    raise AssertionError(f"torch-ar: session {i} differs at {r}")

    wall = _run_threads(n, work)
    if name != "vllm":
        for session in sessions:
            engine.close(session, "bench")
    return _row(f"{name}-ar", n, n * produced, n * produced, wall,
                [x for l in latencies for x in l], _kv_per_session(engine, name, lengths))


def _reopen_cost(engine: Verifier, contexts) -> dict[str, float]:
    """Mean prefill of a first open, and of a second open of the same context after close."""
    first, again = [], []
    for ids in contexts:
        for times in (first, again):
            opened = engine.open(OpenRequest("", "", _fingerprint(engine), list(ids),
                                             SamplingParams()))
            times.append(opened.prefill_ms)
            engine.close(opened.session, "bench")
    return {"open_ms": statistics.mean(first), "reopen_ms": statistics.mean(again),
            "context_tokens": statistics.mean(len(c) for c in contexts)}


def _kv_per_session(engine: Verifier, name: str, lengths: list[int]) -> float:
    """KV bytes one session costs while its round runs (see memory_note)."""
    per_token = engine.runtime.bytes_per_token
    if name == "vllm":
        block = engine.runtime.settings.block_size
        return statistics.mean(math.ceil(n / block) * block for n in lengths) * per_token
    # torch: its slot of the pool, every slot as long as the longest session has needed
    return engine.runtime.runtime.pool.capacity * per_token


def memory_note() -> str:
    return ("kv_bytes_per_session: torch = the session's slot of the preallocated KV pool "
            "(every slot holds as many positions as the longest session has needed, rounded up "
            "to a power of two); vllm = the paged cache blocks its longest request "
            "holds (whole blocks of vllm.block_size), independent of other sessions. Computed "
            "from the sessions' lengths and the measured bytes per token, not sampled from RSS.")


def _row(backend, sessions, rounds, tokens, wall, latencies, kv) -> GoodputRow:
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return GoodputRow(backend=backend, sessions=sessions, rounds=rounds, tokens=tokens,
               wall_s=round(wall, 3), goodput_tok_s=round(tokens / wall, 1),
               round_ms_mean=round(statistics.mean(ordered), 2), round_ms_p50=round(pct(0.5), 2),
               round_ms_p90=round(pct(0.9), 2), kv_bytes_per_session=round(kv))


def _crossover(rows: list[GoodputRow]) -> str:
    by = {(r.backend, r.sessions): r for r in rows}
    levels = sorted({r.sessions for r in rows})
    if not any(r.backend == "vllm" for r in rows):
        return "vLLM not measured"
    ahead = [n for n in levels if ("torch", n) in by and ("vllm", n) in by
             and by["vllm", n].goodput_tok_s >= by["torch", n].goodput_tok_s]
    if not ahead:
        ratios = ", ".join(f"{n}: {by['vllm', n].goodput_tok_s / by['torch', n].goodput_tok_s:.2f}"
                           for n in levels if ("torch", n) in by and ("vllm", n) in by)
        return f"none measured: vLLM goodput / torch goodput by sessions = {ratios}"
    return f"vLLM's goodput >= torch's from {min(ahead)} sessions (at {ahead})"


def _format(row: GoodputRow) -> str:
    return (f"{row.backend:<9} {row.sessions:>3} sessions: {row.goodput_tok_s:>8.1f} tok/s, "
            f"round {row.round_ms_mean:7.1f} ms (p50 {row.round_ms_p50:.1f}, p90 "
            f"{row.round_ms_p90:.1f}), KV/session {row.kv_bytes_per_session / 1024:.0f} KiB")


def _table(rows: list[GoodputRow]) -> str:
    head = (f"| backend | sessions | goodput tok/s | round ms mean | p50 | p90 | "
            f"KV KiB/session |\n|---|---:|---:|---:|---:|---:|---:|")
    lines = [f"| {r.backend} | {r.sessions} | {r.goodput_tok_s:.1f} | {r.round_ms_mean:.1f} | "
             f"{r.round_ms_p50:.1f} | {r.round_ms_p90:.1f} | "
             f"{r.kv_bytes_per_session / 1024:.0f} |" for r in rows]
    return "\n".join([head, *lines])


if __name__ == "__main__":
    sys.exit(main())
