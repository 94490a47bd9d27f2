"""The bench's goals: paired tokens/s ratios per cell (channel, device) with bootstrap
intervals and a verdict against each goal's threshold (bench/matrix/results.py's docstring).

Each goal is one row of data (GoalRow: what is measured, against what, on which cells, the
threshold); `goals()` evaluates every row the same way. DECISION_GOALS are issue 16's;
EARLIER_GOALS the earlier issues', measured on `{adaptive}`: adaptive-pipelined when it ran,
else adaptive (neither ran: one line says so)."""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bench.matrix.config import ADAPTIVE_FAMILY, PEERS, UNVERIFIED, fixed_k
from bench.matrix.results import GenerationSummary, speed
from bench.matrix.stats import CONFIDENCE, RESAMPLES, Interval, bootstrap, divide, verdict, versus_one
from bench.matrix.units import Units

ADAPTIVE = ("adaptive-pipelined", "adaptive")  # the first that ran is "adaptive" in the older goals


@dataclass(frozen=True)
class Comparison:
    """One cell of a goal: `a` against `b` (b empty for a plain statistic of a)."""
    cell: str                  # channel/device
    a: str
    b: str
    value: float | None
    low: float | None
    high: float | None
    verdict: str               # met / not met / tie / n/a, against the goal's threshold
    versus_one: str            # faster / slower / tie (a ratio whose interval spans 1); "" else


@dataclass(frozen=True)
class Goal:
    goal: str                  # what the issue asks
    measured: float | None     # the worst cell's value; None = not measurable
    met: bool | None           # True: met, False: not met, None: tie or not measurable
    detail: str                # per cell, or why it could not be measured
    low: float | None = None   # the worst cell's interval
    high: float | None = None
    verdict: str = "n/a"       # met / not met / tie / n/a over all its cells
    threshold: float = 0.0
    cells: tuple[Comparison, ...] = ()


def overall(verdicts: Sequence[str]) -> str:
    """A goal over cells: not met if any cell is, met if every cell is, else tie (n/a alone:
    nothing measurable)."""
    known = [v for v in verdicts if v != "n/a"]
    if not known:
        return "n/a"
    if "not met" in known:
        return "not met"
    return "met" if all(v == "met" for v in known) else "tie"


def _label(cell: tuple[str, str]) -> str:
    return f"{cell[0]}/{cell[1]}"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def interval_text(value, low, high) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} [{_fmt(low)}, {_fmt(high)}]" if low is not None else f"{value:.2f} [-]"


def _goal(name: str, threshold: float, cells: list[Comparison], at_most: bool = False,
          empty: str = "no profile to measure it on") -> Goal:
    if not cells:
        return Goal(name, None, None, empty, threshold=threshold)
    measurable = [c for c in cells if c.value is not None]
    worst = (max if at_most else min)(measurable, key=lambda c: c.value) if measurable else None
    result = overall([c.verdict for c in cells])
    detail = ", ".join(f"{c.cell} {interval_text(c.value, c.low, c.high)}"
                       f"{' vs ' + c.b if c.b else ''} {c.verdict}" for c in cells)
    return Goal(name, worst.value if worst else None,
                {"met": True, "not met": False}.get(result), detail,
                worst.low if worst else None, worst.high if worst else None, result, threshold,
                tuple(cells))


def _geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values and min(values) > 0 else 0.0


@dataclass(frozen=True)
class GoalRow:
    """One goal as data; `name`, `scope` and `a` are formatted with the run's GoalSettings
    and `adaptive`."""
    name: str
    a: str                     # the configuration measured
    metric: str                # "speed": a's tokens/s over b's; "passes": a's target passes per
                               # token; "passes ratio": a's over b's; "mean speed": a over the
                               # single b best on average, geometric mean over the cells
    versus: str = ""           # b: per cell the best (on the cell's mean tokens/s) of
                               # VERSUS[versus], or that one configuration
    threshold: float | str = 0.0  # a number, or the name of a GoalSettings field
    cells: str = "all"         # which cells count: a key of CELLS
    at_most: bool = False      # met when the value stays at or below the threshold
    requires: tuple[str, ...] = ()  # configurations that must all have run, else one line says so
    scope: str = ""            # appended to the name when `requires` ran
    empty: str = "no profile to measure it on"  # the detail when no cell counts


@dataclass(frozen=True)
class GoalSettings:
    """What the rows' names, thresholds and cell choices read from the run (goals()'s
    arguments, where the defaults are)."""
    rtt_ms: dict[str, float]   # base RTT per channel
    lte_channel: str
    phone_device: str
    peer_rtt_ms: float
    pipelining_rtt_ms: float
    cap_passes_per_token: float


DECISION_GOALS = (
    GoalRow("adaptive >= 0.95x the best other verified configuration (cloud-only included)",
            "adaptive", "speed", "verified others", 0.95),
    GoalRow("adaptive >= 1.1x the best peer rule (RTT >= {peer_rtt_ms:g} ms)",
            "adaptive", "speed", "peers", 1.1, cells="far from peers"),
    GoalRow("adaptive-capped >= 0.95x the best fixed k", "adaptive-capped", "speed", "fixed k", 0.95),
    GoalRow("adaptive-capped >= 0.95x the best fixed k within {cap_passes_per_token:.2f} "
            "passes/token",
            "adaptive-capped", "speed", "fixed k within the cap", 0.95,
            empty="no fixed k within the cap ran"),
    GoalRow("adaptive-capped target passes per token <= {cap_passes_per_token:.2f}",
            "adaptive-capped", "passes", threshold="cap_passes_per_token", at_most=True),
)
EARLIER_GOALS = (
    GoalRow("{adaptive} >= 0.95x the best fixed k of each profile", "{adaptive}", "speed",
            "fixed k", 0.95),
    GoalRow("{adaptive} >= 1.15x the single fixed k best on average", "{adaptive}", "mean speed",
            "fixed k", 1.15, empty="no fixed-k configuration ran"),
    GoalRow("pipelining >= 1.3x without it", "adaptive-pipelined", "speed", "adaptive", 1.3,
            cells="far phone", requires=("adaptive", "adaptive-pipelined"),
            scope=" (RTT >= {pipelining_rtt_ms:g} ms, {phone_device})"),
    GoalRow("{adaptive} within 80% of the oracle", "{adaptive}", "speed", "oracle", 0.8),
    GoalRow("{adaptive} target passes per token <= 0.25 on {lte_channel}", "{adaptive}", "passes",
            threshold=0.25, cells="lte", at_most=True),
    GoalRow("on {lte_channel}: {adaptive} >= 0.8x cloud-only tokens/s", "{adaptive}", "speed",
            "cloud-only", 0.8, cells="lte"),
    GoalRow("on {lte_channel}: {adaptive} target passes <= 0.25x cloud-only's", "{adaptive}",
            "passes ratio", "cloud-only", 0.25, cells="lte", at_most=True),
)

Cell = tuple[str, str]  # (channel, device)

# Which cells a goal counts.
CELLS: dict[str, Callable[[GoalSettings, Cell], bool]] = {
    "all": lambda s, cell: True,
    "far from peers": lambda s, cell: s.rtt_ms.get(cell[0], 0.0) >= s.peer_rtt_ms,
    "far phone": lambda s, cell: (cell[1] == s.phone_device
                                  and s.rtt_ms.get(cell[0], 0.0) >= s.pipelining_rtt_ms),
    "lte": lambda s, cell: cell[0] == s.lte_channel,
}


def _fixed(units: Units, s: GoalSettings, cell: Cell) -> list[str]:
    return [c for c in units.configs(cell) if fixed_k(c) is not None]


# The configurations a goal's `a` is held against in a cell (it takes the best of them there).
VERSUS: dict[str, Callable[[Units, GoalSettings, Cell], list[str]]] = {
    # every verified configuration but the adaptive controller's
    "verified others": lambda units, s, cell: [
        c for c in units.configs(cell)
        if c not in ADAPTIVE_FAMILY and c not in UNVERIFIED and c != "oracle"],
    "peers": lambda units, s, cell: list(PEERS),
    "fixed k": _fixed,
    # a fixed k spending more than the cap is not an option under it
    "fixed k within the cap": lambda units, s, cell: [
        c for c in _fixed(units, s, cell)
        if (units.passes_per_token(cell, c).value or 0.0) <= s.cap_passes_per_token],
}


def goals(generations: Sequence[GenerationSummary], rtt_ms: dict[str, float], *, lte_channel: str = "lte",
          phone_device: str = "phone", peer_rtt_ms: float = 20.0,
          pipelining_rtt_ms: float = 50.0, cap_passes_per_token: float = 0.30,
          resamples: int = RESAMPLES, confidence: float = CONFIDENCE, seed: int = 0) -> list[Goal]:
    """The issues' goals, each measured in this one run per cell, with intervals
    (rtt_ms: base RTT per channel). First the decision goals (issue 16), then the older ones."""
    units = Units(generations, resamples, confidence, seed)
    settings = GoalSettings(rtt_ms, lte_channel, phone_device, peer_rtt_ms, pipelining_rtt_ms,
                            cap_passes_per_token)
    configs = {c for cell in units.cells() for c in units.configs(cell)}
    out = [evaluate(row, units, settings, configs) for row in DECISION_GOALS]
    adaptive = next((c for c in ADAPTIVE if c in configs), None)
    if adaptive is None:
        return out + [Goal("adaptive configurations", None, None, "neither adaptive nor "
                           "adaptive-pipelined ran")]
    return out + [evaluate(row, units, settings, configs, adaptive) for row in EARLIER_GOALS]


def evaluate(row: GoalRow, units: Units, s: GoalSettings, configs: set[str],
             adaptive: str = "") -> Goal:
    """One row of the table measured on every cell it counts."""
    names = {**vars(s), "adaptive": adaptive}
    name, a = row.name.format(**names), row.a.format(**names)
    threshold = getattr(s, row.threshold) if isinstance(row.threshold, str) else row.threshold
    if not set(row.requires) <= configs:
        return Goal(name, None, None, f"needs both {' and '.join(row.requires)}",
                    threshold=threshold)
    name += row.scope.format(**names)
    counted = [cell for cell in units.cells()
               if a in units.configs(cell) and CELLS[row.cells](s, cell)]
    if row.metric == "mean speed":
        return _mean_speed_goal(units, s, name, a, row, counted)
    cells = []
    for cell in counted:
        if row.metric == "speed":
            b = units.best(cell, _versus(row, units, s, cell))
            if b is None:
                continue
            r = units.speed_ratio(cell, a, b)
            cells.append(Comparison(_label(cell), a, b, r.value, r.low, r.high,
                                    verdict(r, threshold), versus_one(r)))
        elif row.metric == "passes":
            r = units.passes_per_token(cell, a)
            cells.append(Comparison(_label(cell), a, "", r.value, r.low, r.high,
                                    verdict(r, threshold, at_most=row.at_most), ""))
        elif row.metric == "passes ratio":
            if row.versus not in units.configs(cell):
                continue
            r = units.passes_ratio(cell, a, row.versus)
            cells.append(Comparison(_label(cell), a, row.versus, r.value, r.low, r.high,
                                    verdict(r, threshold, at_most=row.at_most), ""))
        else:
            raise ValueError(f"goal {row.name!r}: unknown metric {row.metric!r}")
    return _goal(name, threshold, cells, at_most=row.at_most, empty=row.empty)


def _versus(row: GoalRow, units: Units, s: GoalSettings, cell: Cell) -> list[str]:
    return VERSUS[row.versus](units, s, cell) if row.versus in VERSUS else [row.versus]


def _mean_speed_goal(units: Units, s: GoalSettings, name: str, a: str, row: GoalRow,
                     cells: list[Cell]) -> Goal:
    """a over the one b of VERSUS[row.versus] (run in every cell) with the best geometric mean
    of tokens/s over the cells."""
    shared = (set.intersection(*(set(_versus(row, units, s, c)) for c in cells))
              if cells else set())
    if not shared:
        return Goal(name, None, None, row.empty, threshold=row.threshold)
    best = max(sorted(shared, key=fixed_k),
               key=lambda b: _geomean([units.mean_speed(c, b) for c in cells]))
    return _average_goal(units, name, a, best, cells, row.threshold)


def _average_goal(units: Units, name: str, a: str, b: str, cells: list[Cell],
                  threshold: float) -> Goal:
    """Geometric mean over cells of a's tokens/s over b's, one joint bootstrap of the prompts
    (prompt p is the same text in every cell)."""
    prompts = sorted({u[0] for cell in cells for u in set(units.by[cell][a]) & set(units.by[cell][b])})
    index = {p: i for i, p in enumerate(prompts)}
    num = np.zeros((len(cells), len(prompts)))
    den = np.zeros((len(cells), len(prompts)))
    for j, cell in enumerate(cells):
        ua, ub = units.by[cell][a], units.by[cell][b]
        for unit in set(ua) & set(ub):
            num[j, index[unit[0]]] += speed(ua[unit])
            den[j, index[unit[0]]] += speed(ub[unit])
    if not prompts or (den.sum(axis=1) == 0).any() or (num.sum(axis=1) == 0).any():
        return Goal(name, None, None, "a zero speed: no geometric mean", threshold=threshold)

    def stat(idx):
        ratios = divide(num[:, idx].sum(axis=2), den[:, idx].sum(axis=2))   # [cells, resamples]
        with np.errstate(divide="ignore"):
            return np.exp(np.log(ratios).mean(axis=0))
    value = _geomean(list(num.sum(axis=1) / den.sum(axis=1)))
    low, high = bootstrap(stat, len(prompts), units.resamples, units.confidence, units.seed)
    interval = Interval(value, low, high)
    result = verdict(interval, threshold)
    return Goal(name, value, {"met": True, "not met": False}.get(result),
                f"{b} is best on average (geometric mean over {len(cells)} profiles); "
                f"ratio = geometric mean {interval_text(value, low, high)}",
                low, high, result, threshold,
                (Comparison("all", a, b, value, low, high, result, versus_one(interval)),))
