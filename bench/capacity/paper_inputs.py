"""The on-paper model's measured inputs (bench/capacity/paper.py):

- per channel x device cell, each option's tokens per round (tau) and time off the verifier per
  round (z), from a `tandem capacity` JSON's unloaded rows (N = 1: the cell's TPOT p50 and p90
  and the users' passes per token, less what the model says the idle verifier took), for
  cloud-only and fixed-k4; other k from the decided bench's tau by k (scaled to the run's
  measured k = 4) and the device's draft speed (draft_behaviour.json, sources named there);
- the engine's CPU work around a pass (Engine.pass_ms, job_ms), fitted on the verifier's own
  readings: cloud-only rows of a capacity run (CPU per token, passes per token: everything the
  one-core server does, gRPC included), or a verifier-bench JSON's target-only rows (the engine
  in-process: round p50 at each session count).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from bench.capacity.paper import Engine, Model, UserMode, Workload

BEHAVIOUR = Path(__file__).with_name("draft_behaviour.json")
FIXED_K = 4


def load_rows(paths: list[Path]) -> list[dict]:
    """Every row of one or more capacity JSONs (a later file's rows join the earlier ones)."""
    rows: list[dict] = []
    for path in paths:
        rows += json.loads(Path(path).read_text())["rows"]
    return rows


def cells_of(rows: list[dict]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r["channel"], r["device"]) for r in rows))


def _unloaded(rows: list[dict], cell: tuple[str, str], config: str) -> dict | None:
    mine = [r for r in rows if (r["channel"], r["device"], r["config"]) == (*cell, config)
            and r.get("tpot_p50_s")]
    return min(mine, key=lambda r: r["users"]) if mine else None


def behaviour(path: Path = BEHAVIOUR) -> dict:
    return json.loads(Path(path).read_text())


def options_for(model: Model, rows: list[dict], cell: tuple[str, str], ks: list[int],
                known: dict | None = None) -> list[UserMode]:
    """cloud-only and fixed k for each k in ks, calibrated on the cell's unloaded rows."""
    known = known or behaviour()
    cloud = _unloaded(rows, cell, "cloud-only")
    fixed = _unloaded(rows, cell, f"fixed-k{FIXED_K}")
    options = []
    if cloud is not None:
        options.append(_calibrated(model, UserMode("cloud-only", 0, 1.0, {}), cloud))
    if fixed is None:
        return options
    base = _calibrated(model, UserMode(f"fixed-k{FIXED_K}", FIXED_K,
                                     1.0 / fixed["passes_per_token"], {}), fixed)
    tau_by_k = {int(k): v for k, v in known["tau_by_k"].items()}
    speed = known["draft_tok_s"][cell[1]]
    accepted = (base.tau - 1.0) / (tau_by_k[FIXED_K] - 1.0)
    for k in ks:
        if k == FIXED_K:
            options.append(base)
            continue
        tau = 1.0 + (tau_by_k[k] - 1.0) * accepted
        extra = (k - FIXED_K) / speed
        options.append(UserMode(f"fixed-k{k}", k, tau, {q: z + extra for q, z in base.z_s.items()},
                              base.ttft_link_s))
    return options


def _calibrated(model: Model, option: UserMode, row: dict) -> UserMode:
    """The option's z (and TTFT's link part) such that the model at the row's N reproduces
    its TPOT p50 and p90 (the verifier's part at that load is the model's)."""
    measured = {"p50": row["tpot_p50_s"], "p90": row["tpot_p90_s"]}
    guess = replace(option, z_s={q: 0.0 for q in measured})
    for _ in range(3):  # the verifier's part depends a little on z (its busy share)
        load = model.load(guess, row["users"])
        verifier_s = load.response_ms / 1000.0
        guess = replace(guess, z_s={q: t * option.tau - verifier_s for q, t in measured.items()})
    ttft = row.get("ttft_p90_s") or 0.0
    return replace(guess, ttft_link_s=ttft - model.verifier_ttft_s(guess))


def engine_from_capacity(surface, rows: list[dict], workload: Workload, base: Engine,
                         min_busy: float = 0.8) -> Engine:
    """pass_ms and job_ms by least squares on cloud-only rows whose verifier was busy (its CPU
    per pass then is its time per pass): y = CPU per decode pass less the surface's pass and
    the prompts' passes, against B (every user in every pass up to max_batch)."""
    points = []
    for r in rows:
        if (r["config"] != "cloud-only" or not r.get("verifier_cpu_s_per_token")
                or (r.get("verifier_busy") or 0.0) < min_busy):
            continue
        batch = min(r["users"], base.max_batch)
        per_token_ms = r["verifier_cpu_s_per_token"] * 1000.0
        prompt_ms = surface.pass_ms(1, workload.prompt_tokens, workload.prompt_tokens)
        forward = surface.pass_ms(batch, 1, workload.pass_context())
        # CPU per pass of B tokens: the forward, the prompts' forwards (one per max_tokens of
        # tokens, not shared: the unloaded case), and the engine
        points.append((batch, per_token_ms * batch - forward
                       - prompt_ms * batch / workload.max_tokens))
    return _fit(points, base)


def engine_from_verifier_bench(surface, path: Path, base: Engine,
                               context: float = 280.0) -> Engine:
    """From `tandem verifier-bench` JSON's torch-ar rows (the engine decoding alone, every
    session in every pass): round p50 less the surface's 1-token pass at that B."""
    data = json.loads(Path(path).read_text())
    points = [(r["sessions"], r["round_ms_p50"] - surface.pass_ms(r["sessions"], 1, context))
              for r in data["rows"] if r["backend"] == "torch-ar"]
    return _fit(points, base)


def _fit(points: list[tuple[float, float]], base: Engine) -> Engine:
    if not points:
        return base
    if len({b for b, _ in points}) < 2:
        b, y = points[0]
        return replace(base, pass_ms=max(y, 0.0), job_ms=0.0)
    xs, ys = [b for b, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    slope = max(slope, 0.0)
    return replace(base, pass_ms=max(my - slope * mx, 0.0), job_ms=slope)
