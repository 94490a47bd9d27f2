"""A verify pass's time surface: ms for a pass of B sessions feeding n tokens each at context c
(the pass ends at position c of every session), and what follows from it (the position cost the
verifier publishes, the KV memory bound). Either measured (`tandem pass-cost`, a grid of points)
or published (a curve of ms by the pass's total tokens, plus the K/V each session's attention
reads, bench/passcost/published/*.json). Plain Python: the on-paper model reads it without
torch.
"""
from __future__ import annotations

import bisect
import csv
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from sim.writers import write_json


@dataclass
class PassPoint:
    batch: int        # sessions in the pass
    tokens: int       # new tokens per session (1 = a decode step, k + 1 = a round of k)
    context: int      # positions each session holds after the pass
    ms: float         # median over reps
    ms_min: float
    ms_max: float
    reps: int


@dataclass
class Surface:
    """What a pass costs on one device for one target. `points` (measured) or `total_tokens`
    (published: [[tokens in the pass, ms], ...] plus `kv_read_gb_s`) says how."""
    source: str                       # where the figures come from
    device: str
    model: str
    dtype: str
    kv_bytes_per_token: int
    kv_room_bytes: int | None = None  # memory left for K/V once the weights are loaded
    points: list[PassPoint] = field(default_factory=list)
    total_tokens: list[list[float]] = field(default_factory=list)
    kv_read_gb_s: float | None = None  # published: attention reads every cached K/V once a pass
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    probe_pairs: list[list[float]] = field(default_factory=list)  # [verifier's c, timer's c]
    serving_path: str | None = None   # the runtime's path: slots (the KV pool) or exact

    # -- reading it -------------------------------------------------------------------------

    def pass_ms(self, batch: float, tokens: float, context: float) -> float:
        """Interpolated (extrapolated linearly past the grid) time of one pass, ms."""
        if self.total_tokens:
            return self._published_ms(batch, tokens, context)
        index = self._index()
        contexts = _neighbours(list(index), context)
        values = [self._at_context(batch, tokens, c) for c in contexts]
        return max(_interp(contexts, values, context, extrapolate=True), 0.0)

    def position_ms(self, batch: float, context: float) -> float:
        """What one more fed position adds to a pass of `batch` sessions, ms (the verifier's c,
        TargetRuntime.position_ms): the slope over tokens per session, per session."""
        wide, narrow = self.pass_ms(batch, 9, context), self.pass_ms(batch, 1, context)
        return max(wide - narrow, 0.0) / (8 * batch)

    def step_ms(self, batch: float, context: float) -> float:
        """A 1-token session's share of a pass of `batch` sessions, ms."""
        return self.pass_ms(batch, 1, context) / batch

    def position_cost(self, batch: float, context: float) -> float:
        """Opened.position_cost for passes of `batch` 1-token sessions: c / step."""
        return min(self.position_ms(batch, context) / self.step_ms(batch, context), 1.0)

    def kv_sessions(self, context: int) -> int | None:
        """Sessions whose K/V at `context` positions fit the memory left (None: unknown)."""
        if self.kv_room_bytes is None or not self.kv_bytes_per_token:
            return None
        return int(self.kv_room_bytes // (self.kv_bytes_per_token * context))

    def _published_ms(self, batch: float, tokens: float, context: float) -> float:
        xs = [t for t, _ in self.total_tokens]
        ys = [ms for _, ms in self.total_tokens]
        compute = _interp(xs, ys, batch * tokens, extrapolate=True)
        reads = 0.0
        if self.kv_read_gb_s:
            reads = batch * context * self.kv_bytes_per_token / (self.kv_read_gb_s * 1e6)
        return compute + reads

    def _at_context(self, batch: float, tokens: float, context: int) -> float:
        by_batch = self._index()[context]
        batches = _neighbours(list(by_batch), batch)
        values = [_along_tokens(by_batch[b], tokens) for b in batches]
        return _interp(batches, values, batch, extrapolate=True)

    def _index(self) -> dict[int, dict[int, list[PassPoint]]]:
        """context -> batch (ascending) -> its points by tokens; built once (the model reads
        the surface thousands of times)."""
        if getattr(self, "_by", None) is None or self._by_count != len(self.points):
            by: dict[int, dict[int, list[PassPoint]]] = {}
            for p in sorted(self.points, key=lambda p: (p.context, p.batch, p.tokens)):
                by.setdefault(p.context, {}).setdefault(p.batch, []).append(p)
            self._by, self._by_count = by, len(self.points)
        return self._by

    # -- files ------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Surface:
        data = dict(data)
        data["points"] = [PassPoint(**p) for p in data.get("points", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def load(cls, path: Path) -> Surface:
        return cls.from_json(json.loads(Path(path).read_text()))

    def write(self, json_path: Path, csv_path: Path | None = None) -> None:
        write_json(json_path, self.to_json(), indent=1)
        if csv_path is not None:
            with csv_path.open("w", newline="") as out:
                writer = csv.writer(out)
                writer.writerow(["batch", "tokens", "context", "ms", "ms_min", "ms_max", "reps",
                                 "ms_per_session", "ms_per_position"])
                for p in self.points:
                    writer.writerow([p.batch, p.tokens, p.context, f"{p.ms:.4f}",
                                     f"{p.ms_min:.4f}", f"{p.ms_max:.4f}", p.reps,
                                     f"{p.ms / p.batch:.4f}",
                                     f"{p.ms / (p.batch * p.tokens):.4f}"])

    def grid(self) -> tuple[list[int], list[int], list[int]]:
        """The measured batches, tokens and contexts."""
        return (sorted({p.batch for p in self.points}), sorted({p.tokens for p in self.points}),
                sorted({p.context for p in self.points}))


def _along_tokens(points: list[PassPoint], tokens: float) -> float:
    """Median ms at `tokens` per session (points sorted by tokens): piecewise linear over the
    measured tokens, past them along the least-squares slope (a prompt's pass feeds far more
    than a round)."""
    xs, ys = [p.tokens for p in points], [p.ms for p in points]
    if len(xs) == 1 or xs[0] <= tokens <= xs[-1]:
        return _interp(xs, ys, tokens, extrapolate=False)
    slope = max(_slope(xs, ys), 0.0)  # more tokens never cost less (noise can say so)
    edge = 0 if tokens < xs[0] else -1
    return max(ys[edge] + slope * (tokens - xs[edge]), 0.0)


def _neighbours(xs: list, x: float) -> list:
    """The two grid values around x (the last or first two past the ends): all _interp needs."""
    if len(xs) <= 2:
        return xs
    i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
    return xs[i: i + 2]


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def _interp(xs: list[float], ys: list[float], x: float, extrapolate: bool) -> float:
    """Linear interpolation; outside the range linear along the nearest segment when
    `extrapolate` (never below 0 and the nearest point's value going down, never below it
    going up: a bigger pass never costs less than a measured smaller one, where a noisy
    last segment would fall, as a smoke surface's batch 2 at 13.2 ms after batch 1 at 16.1
    read 0 ms at batch 64), else clamped."""
    if len(xs) == 1:
        return ys[0]
    if x <= xs[0]:
        if not extrapolate:
            return ys[0]
        low = ys[0] + (ys[1] - ys[0]) * (x - xs[0]) / (xs[1] - xs[0])
        return min(max(low, 0.0), ys[0])
    if x >= xs[-1]:
        if not extrapolate:
            return ys[-1]
        return ys[-1] + max(ys[-1] - ys[-2], 0.0) * (x - xs[-1]) / (xs[-1] - xs[-2])
    i = bisect.bisect_right(xs, x) - 1
    return ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])
