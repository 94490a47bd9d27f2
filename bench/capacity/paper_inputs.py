"""The on-paper model's measured inputs (bench/capacity/paper.py):

- per channel x device cell, each option's tokens per round (tau) and time off the verifier per
  round (z), from a `tandem capacity` JSON's lightly loaded rows (N <= 4: the cell's TPOT p50
  and p90 and the users' passes per token, less what the model says the verifier took at that
  N), for cloud-only and fixed-k4; other k from the decided bench's tau by k (scaled to the run's
  measured k = 4) and the device's draft speed (draft_behaviour.json, sources named there);
- the verifier around its passes: for the run's own verifier, the level of its passes (a scale
  on the surface) fitted on the verifier's CPU readings of cloud-only rows (everything the
  one-core server does, gRPC included); for a predicted one, the engine's CPU work per pass and
  per session (Engine.pass_ms, job_ms) fitted on a verifier-bench JSON's target-only rows (the
  engine in-process: round p50 at each session count), or given.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from bench.capacity.options import CapacityOptions
from bench.capacity.paper import Engine, Model, UserMode, Workload

BEHAVIOUR = Path(__file__).with_name("draft_behaviour.json")
FIXED_K = 4
LIGHT_USERS = 4   # rows up to this many users calibrate a cell (the verifier mostly idle)
CLOUD_LIKE = 0.9  # an adaptive run at this many passes per token or more lets the cloud generate


def load_rows(paths: list[Path]) -> list[dict]:
    """Every row of one or more capacity JSONs (a later file's rows join the earlier ones)."""
    rows: list[dict] = []
    for path in paths:
        rows += json.loads(Path(path).read_text())["rows"]
    return rows


def cells_of(rows: list[dict]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r["channel"], r["device"]) for r in rows))


def _light(rows: list[dict], cell: tuple[str, str], config: str) -> list[dict]:
    """The cell's rows of `config` at up to LIGHT_USERS users: each user at its own offset into
    the link's trace, so together they sample the link's spread better than one user does."""
    return [r for r in rows if (r["channel"], r["device"], r["config"]) == (*cell, config)
            and r.get("tpot_p50_s") and r["users"] <= LIGHT_USERS]


def behaviour(path: Path = BEHAVIOUR) -> dict:
    return json.loads(Path(path).read_text())


def options_for(model: Model, rows: list[dict], cell: tuple[str, str], ks: list[int],
                known: dict | None = None,
                ttft_slo_s: float = CapacityOptions.slo_ttft_s) -> list[UserMode]:
    """cloud-only and fixed k for each k in ks, calibrated on the cell's unloaded rows."""
    known = known or behaviour()
    cloud = _light(rows, cell, "cloud-only")
    fixed = _light(rows, cell, f"fixed-k{FIXED_K}")
    options = []
    if cloud:
        options.append(_calibrated(model, UserMode("cloud-only", 0, 1.0, {}), cloud, ttft_slo_s))
    if not fixed:
        return options
    tau = _mean([1.0 / r["passes_per_token"] for r in fixed], fixed)
    base = _calibrated(model, UserMode(f"fixed-k{FIXED_K}", FIXED_K, tau, {}), fixed,
                       ttft_slo_s)
    tau_by_k = {int(k): v for k, v in known["tau_by_k"].items()}
    speed = known["draft_tok_s"][cell[1]]
    accepted = (base.tau - 1.0) / (tau_by_k[FIXED_K] - 1.0)
    for k in ks:
        if k == FIXED_K:
            options.append(base)
            continue
        tau = 1.0 + (tau_by_k[k] - 1.0) * accepted
        extra = (k - FIXED_K) / speed
        options.append(replace(base, name=f"fixed-k{k}", k=k, tau=tau,
                               z_s={q: z + extra for q, z in base.z_s.items()}))
    return options


def controller_for(model: Model, rows: list[dict], cell: tuple[str, str], ks: list[int],
                   known: dict | None = None,
                   ttft_slo_s: float = CapacityOptions.slo_ttft_s) -> UserMode | None:
    """The adaptive controller as the run measured it, calibrated like cloud-only and fixed k
    on its own unloaded rows (None without them): under load its priced choice is not the best
    fixed k (options_for) but the cheapest per token that keeps the floor, and its long blocks
    spread TPOT wider than fixed k = 4's (wifi/laptop at 32 users: TPOT p90 51 ms against 39,
    p50 both 28). Its rows' passes per token say which rounds it runs: cloud runs at
    CLOUD_LIKE or more, else blocks of the k whose tau (options_for's) comes nearest."""
    light = _light(rows, cell, "adaptive")
    if not light:
        return None
    passes = _mean([r["passes_per_token"] for r in light], light)
    if passes >= CLOUD_LIKE:
        return _calibrated(model, UserMode("adaptive", 0, 1.0, {}), light, ttft_slo_s)
    tau = 1.0 / passes
    by_k = {o.k: o.tau for o in options_for(model, rows, cell, ks, known, ttft_slo_s) if o.k}
    k = min(by_k, key=lambda k: abs(by_k[k] - tau)) if by_k else FIXED_K
    return _calibrated(model, UserMode("adaptive", k, tau, {}), light, ttft_slo_s)


def _calibrated(model: Model, option: UserMode, rows: list[dict],
                ttft_slo_s: float) -> UserMode:
    """The option's z (and TTFT's link part, p50 and p90) such that the model at each row's N
    reproduces its TPOT p50 and p90 (the verifier's part at that load is the model's),
    averaged over the rows by their requests; and per TPOT SLO the share of requests the link
    fails beyond those bodies (UserMode.fades: the rows' good share below the model's)."""
    z: dict[str, list[float]] = {"p50": [], "p90": []}
    ttft: dict[str, list[float]] = {"p50": [], "p90": []}
    for row in rows:
        measured = {"p50": row["tpot_p50_s"], "p90": row["tpot_p90_s"]}
        guess = replace(option, z_s={q: 0.0 for q in measured})
        for _ in range(3):  # the verifier's part depends a little on z (its busy share)
            verifier_s = model.load(guess, row["users"]).response_ms / 1000.0
            guess = replace(guess, z_s={q: t * option.tau - verifier_s
                                        for q, t in measured.items()})
        for q in z:
            z[q].append(guess.z_s[q])
        verifier_ttft = model.verifier_ttft_s(guess)
        p90 = row.get("ttft_p90_s") or 0.0
        ttft["p90"].append(p90 - verifier_ttft)
        ttft["p50"].append((row.get("ttft_p50_s") or p90) - verifier_ttft)
    has_p50 = all(row.get("ttft_p50_s") for row in rows)
    z_s, spread = {q: _mean(v, rows) for q, v in z.items()}, {}
    if option.k > 0:  # speculation: the spread scales with the TPOT (UserMode.spread)
        z_s = {"p50": z_s["p50"]}
        spread = {"p90": _mean([r["tpot_p90_s"] / r["tpot_p50_s"] for r in rows], rows)}
    calibrated = replace(option, z_s=z_s, spread=spread,
                         ttft_link_s=_mean(ttft["p90"], rows),
                         ttft_link_p50_s=_mean(ttft["p50"], rows) if has_p50 else None)
    return replace(calibrated, fades=_fades(model, calibrated, rows, ttft_slo_s))


def _fades(model: Model, option: UserMode, rows: list[dict],
           ttft_slo_s: float) -> dict[str, float]:
    """Per TPOT SLO the rows' requests failed beyond the bodies: 1 - their measured good share
    over the model's (bodies alone) at each row's N."""
    fades = {}
    slos = set.intersection(*(set(r.get("good_share_by_tpot") or {}) for r in rows))
    for slo in slos:
        good = _mean([r["good_share_by_tpot"][slo] for r in rows], rows)
        body = _mean([model.good_share(option, r["users"], float(slo), ttft_slo_s, fades=False)
                      for r in rows], rows)
        fades[slo] = min(max(1.0 - good / body, 0.0), 1.0) if body > 0 else 0.0
    return fades


def _mean(values: list[float], rows: list[dict]) -> float:
    weights = [max(r.get("requests", 1), 1) for r in rows]
    return sum(v * w for v, w in zip(values, weights)) / sum(weights)


def engine_from_capacity(surface, rows: list[dict], workload: Workload, base: Engine,
                         min_busy: float = 0.8) -> Engine:
    """The run's verifier as a scaled surface: its passes cost `scale` times the surface, scale
    by least squares (through 0) on the cloud-only rows whose verifier was busy (its CPU per
    token then is its time per token): CPU per decode pass of B users (every user in every
    pass up to max_batch) against the surface's pass and its share of the prompts' passes.
    One number, so that a surface measured on this shared CPU at another moment (the preamble:
    speed only as ratios within one run) keeps its shape and takes the run's level; the
    engine's own work around the pass is in the scale."""
    pairs = []
    for r in rows:
        if (r["config"] != "cloud-only" or not r.get("verifier_cpu_s_per_token")
                or (r.get("verifier_busy") or 0.0) < min_busy):
            continue
        batch = min(r["users"], base.max_batch)
        prompt_ms = surface.pass_ms(1, workload.prompt_tokens, workload.prompt_tokens)
        forward = surface.pass_ms(batch, 1, workload.pass_context())
        pairs.append((forward + prompt_ms * batch / workload.max_tokens,
                      r["verifier_cpu_s_per_token"] * 1000.0 * batch))
    if not pairs:
        return base
    scale = sum(x * y for x, y in pairs) / sum(x * x for x, _ in pairs)
    return replace(base, pass_ms=0.0, job_ms=0.0, surface_scale=scale)


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
