"""From generations to the bench's rows, goal ratios, table and JSON.

One `Generation` per (channel, device, configuration, prompt); one `Row` per (channel, device,
configuration) with exactly the issue's fields, so other tools can read the JSON:

  tokens_per_s      mean over requests of tokens / request wall time (ANCHORS: speed-up is a
                    ratio of these means, same prompts, greedy)
  ttft_s, tpot_s    mean over requests of TTFT and TPOT (tandem.metrics.tpot)
  tau               tandem.metrics.tau over every verification round of the configuration
  passes_per_token  tandem.metrics.passes_per_token: target passes / tokens, all requests
  bytes_per_token   serialized bytes up + down / tokens (protobuf payloads, no framing)
  joules_per_token  the device profile's energy (draft tokens computed + bytes) / tokens
  agreement         share of output positions equal to the target-only greedy output
"""
from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.bench.config import PEERS, fixed_k
from tandem import metrics

ROW_FIELDS = ("channel", "device", "config", "tokens_per_s", "ttft_s", "tpot_s", "tau",
              "passes_per_token", "bytes_per_token", "joules_per_token", "agreement")
ADAPTIVE = ("adaptive-pipelined", "adaptive")  # the first that ran is "adaptive" in the goals


@dataclass
class Generation:
    """One generation of one configuration, reduced to what the rows need."""
    channel: str
    device: str
    config: str
    prompt: int
    tokens: int
    wall_s: float
    ttft_s: float
    accepted: int = 0          # accepted draft tokens over verification rounds
    rounds: int = 0            # verification rounds
    target_passes: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    draft_tokens: int = 0      # tokens the draft computed (discarded blocks included)
    joules: float = 0.0
    agreement: float = 0.0
    unverified: int = 0        # tokens committed without the target (local fallback)
    reopens: int = 0           # streams re-opened (evictions, broken links)
    rounds_log: list[dict] = field(default_factory=list)  # kept for the plotted session only


@dataclass(frozen=True)
class Row:
    channel: str
    device: str
    config: str
    tokens_per_s: float
    ttft_s: float
    tpot_s: float
    tau: float
    passes_per_token: float
    bytes_per_token: float
    joules_per_token: float
    agreement: float


def agreement(output: Sequence[int], reference: Sequence[int]) -> float:
    """Share of the reference's positions where the output has the same token (a missing token
    disagrees); 1.0 for an empty reference."""
    if not reference:
        return 1.0
    return sum(1 for a, b in zip(output, reference) if a == b) / len(reference)


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def summarize(generations: Sequence[Generation]) -> Row:
    g0 = generations[0]
    tokens = sum(g.tokens for g in generations)
    return Row(
        channel=g0.channel, device=g0.device, config=g0.config,
        tokens_per_s=statistics.fmean(_ratio(g.tokens, g.wall_s) for g in generations),
        ttft_s=statistics.fmean(g.ttft_s for g in generations),
        tpot_s=statistics.fmean(metrics.tpot(g.wall_s, g.ttft_s, g.tokens) for g in generations),
        tau=metrics.tau(sum(g.accepted for g in generations), sum(g.rounds for g in generations)),
        passes_per_token=metrics.passes_per_token(sum(g.target_passes for g in generations), tokens),
        bytes_per_token=_ratio(sum(g.bytes_up + g.bytes_down for g in generations), tokens),
        joules_per_token=_ratio(sum(g.joules for g in generations), tokens),
        agreement=statistics.fmean(g.agreement for g in generations))


def details_of(generations: Iterable[Generation]) -> list[dict]:
    """Per row, what explains it beyond the row's fields: requests, tokens committed without
    the target (a verified configuration's agreement below 100% comes from these), re-opens."""
    groups: dict[tuple[str, str, str], list[Generation]] = {}
    for g in generations:
        groups.setdefault((g.channel, g.device, g.config), []).append(g)
    return [{"channel": c, "device": d, "config": n, "requests": len(gs),
             "unverified_share": _ratio(sum(g.unverified for g in gs), sum(g.tokens for g in gs)),
             "reopens": sum(g.reopens for g in gs)} for (c, d, n), gs in groups.items()]


def rows_of(generations: Iterable[Generation]) -> list[Row]:
    """One row per (channel, device, configuration), in the order they first ran."""
    groups: dict[tuple[str, str, str], list[Generation]] = {}
    for g in generations:
        groups.setdefault((g.channel, g.device, g.config), []).append(g)
    return [summarize(gs) for gs in groups.values()]


# ---- goals -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Goal:
    goal: str                  # what the issue asks
    measured: float | None     # the worst case over the profiles it covers; None = not measurable
    met: bool | None
    detail: str                # per profile, or why it could not be measured


def _profiles(rows: Sequence[Row]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r.channel, r.device) for r in rows))


def _geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values and min(values) > 0 else 0.0


def goals(rows: Sequence[Row], rtt_ms: dict[str, float], *, lte_channel: str = "lte",
          phone_device: str = "phone", peer_rtt_ms: float = 20.0,
          pipelining_rtt_ms: float = 50.0) -> list[Goal]:
    """The issue's goal ratios, each measured in this one run (rtt_ms: base RTT per channel)."""
    speed = {(r.channel, r.device, r.config): r.tokens_per_s for r in rows}
    row = {(r.channel, r.device, r.config): r for r in rows}
    configs = {r.config for r in rows}
    adaptive = next((c for c in ADAPTIVE if c in configs), None)
    profiles = _profiles(rows)
    out: list[Goal] = []

    def worst(name: str, threshold: float, pairs: list[tuple[str, float]], lower_is_better=False) -> Goal:
        if not pairs:
            return Goal(name, None, None, "no profile to measure it on")
        values = [v for _, v in pairs]
        value = max(values) if lower_is_better else min(values)
        met = value <= threshold if lower_is_better else value >= threshold
        return Goal(name, value, met, ", ".join(f"{p} {v:.2f}" for p, v in pairs))

    if adaptive is None:
        return [Goal("adaptive configurations", None, None, "neither adaptive nor "
                     "adaptive-pipelined ran")]

    def label(channel: str, device: str) -> str:
        return f"{channel}/{device}"

    peers = [c for c in PEERS if c in configs]
    pairs = [(label(c, d), _ratio(speed[(c, d, adaptive)], max(speed[(c, d, p)] for p in peers)))
             for c, d in profiles if rtt_ms.get(c, 0.0) >= peer_rtt_ms and peers]
    out.append(worst(f"{adaptive} >= 1.1x the best peer rule (RTT >= {peer_rtt_ms:g} ms)", 1.1, pairs))

    fixed = sorted((c for c in configs if fixed_k(c) is not None), key=fixed_k)
    pairs = [(label(c, d), _ratio(speed[(c, d, adaptive)], max(speed[(c, d, f)] for f in fixed)))
             for c, d in profiles if fixed]
    out.append(worst(f"{adaptive} >= 0.95x the best fixed k of each profile", 0.95, pairs))

    if fixed:
        best = max(fixed, key=lambda f: _geomean([speed[(c, d, f)] for c, d in profiles]))
        ratio = _geomean([_ratio(speed[(c, d, adaptive)], speed[(c, d, best)]) for c, d in profiles])
        out.append(Goal(f"{adaptive} >= 1.15x the single fixed k best on average", ratio,
                        ratio >= 1.15, f"{best} is best on average (geometric mean over "
                                       f"{len(profiles)} profiles); ratio = geometric mean"))
    else:
        out.append(Goal(f"{adaptive} >= 1.15x the single fixed k best on average", None, None,
                        "no fixed-k configuration ran"))

    if {"adaptive", "adaptive-pipelined"} <= configs:
        pairs = [(label(c, d), _ratio(speed[(c, d, "adaptive-pipelined")], speed[(c, d, "adaptive")]))
                 for c, d in profiles if d == phone_device and rtt_ms.get(c, 0.0) >= pipelining_rtt_ms]
        out.append(worst(f"pipelining >= 1.3x without it (RTT >= {pipelining_rtt_ms:g} ms, "
                         f"{phone_device})", 1.3, pairs))
    else:
        out.append(Goal("pipelining >= 1.3x without it", None, None,
                        "needs both adaptive and adaptive-pipelined"))

    pairs = [(label(c, d), _ratio(speed[(c, d, adaptive)], speed[(c, d, "oracle")]))
             for c, d in profiles if "oracle" in configs]
    out.append(worst(f"{adaptive} within 80% of the oracle", 0.8, pairs))

    lte = [(c, d) for c, d in profiles if c == lte_channel]
    pairs = [(label(c, d), row[(c, d, adaptive)].passes_per_token) for c, d in lte]
    out.append(worst(f"{adaptive} target passes per token <= 0.25 on {lte_channel}", 0.25, pairs,
                     lower_is_better=True))
    cloud = "cloud-only" in configs
    pairs = [(label(c, d), _ratio(speed[(c, d, adaptive)], speed[(c, d, "cloud-only")]))
             for c, d in lte if cloud]
    out.append(worst(f"on {lte_channel}: {adaptive} >= 0.8x cloud-only tokens/s", 0.8, pairs))
    pairs = [(label(c, d), _ratio(row[(c, d, adaptive)].passes_per_token,
                                  row[(c, d, "cloud-only")].passes_per_token))
             for c, d in lte if cloud]
    out.append(worst(f"on {lte_channel}: {adaptive} target passes <= 0.25x cloud-only's", 0.25,
                     pairs, lower_is_better=True))
    return out


# ---- output ----------------------------------------------------------------------------------

COLUMNS = [  # header, Row field, format
    ("channel", "channel", "{}"), ("device", "device", "{}"), ("config", "config", "{}"),
    ("tok/s", "tokens_per_s", "{:.1f}"), ("TTFT s", "ttft_s", "{:.3f}"),
    ("TPOT ms", "tpot_s", "{:.1f}"), ("tau", "tau", "{:.2f}"),
    ("passes/tok", "passes_per_token", "{:.3f}"), ("bytes/tok", "bytes_per_token", "{:.1f}"),
    ("mJ/tok", "joules_per_token", "{:.1f}"), ("agree", "agreement", "{:.1%}"),
]
_SCALE = {"tpot_s": 1000.0, "joules_per_token": 1000.0}


def format_table(rows: Sequence[Row], markdown: bool = False) -> str:
    cells = [[h for h, _, _ in COLUMNS]]
    for r in rows:
        cells.append([fmt.format(getattr(r, name) * _SCALE.get(name, 1.0))
                      if not isinstance(getattr(r, name), str) else getattr(r, name)
                      for _, name, fmt in COLUMNS])
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in cells]
        lines.insert(1, "|" + "|".join("---" if i < 3 else "---:" for i in range(len(COLUMNS))) + "|")
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_goals(items: Sequence[Goal], markdown: bool = False) -> str:
    lines = []
    for g in items:
        verdict = "n/a" if g.met is None else ("met" if g.met else "NOT met")
        value = "-" if g.measured is None else f"{g.measured:.2f}"
        lines.append(f"| {g.goal} | {value} | {verdict} | {g.detail} |" if markdown
                     else f"  [{verdict:>7}] {g.goal}: {value}  ({g.detail})")
    if markdown:
        lines[:0] = ["| goal | measured (worst profile) | verdict | per profile |", "|---|---:|---|---|"]
    return "\n".join(lines)


def write_json(path: Path, rows: Sequence[Row], goal_list: Sequence[Goal], extra: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"rows": [asdict(r) for r in rows], "goals": [asdict(g) for g in goal_list], **extra}
    path.write_text(json.dumps(payload, indent=2) + "\n")
