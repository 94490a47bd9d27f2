"""Mahimahi link traces as a schedule of delivery opportunities.

Format (mahimahi `mm-link`): one integer per line, a time in milliseconds from the start of the
trace; each line is one opportunity to carry one 1500-byte packet across the bottleneck, and a
time repeated n times is n packets in that millisecond. When the schedule runs out it starts
again, shifted by its last timestamp (mahimahi's `base_timestamp_ += schedule_.back()`), so the
trace's period is its last line, not its line count.

Opportunities are numbered 0, 1, 2, ... over all repeats; `time_of(i)` and `count_before(t)`
map between that index and link time in seconds, which is all the shaper and the tests need.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

PACKET_BYTES = 1500  # what one mahimahi delivery opportunity carries


class TraceError(ValueError):
    """A trace file that is missing, empty, not integers, or not in time order."""


@dataclass(frozen=True)
class Trace:
    """One direction's capacity: opportunity times within one period, repeated forever."""
    times_ms: tuple[int, ...]  # [n] non-decreasing, the last one > 0
    source: str = ""

    def __post_init__(self) -> None:
        if not self.times_ms:
            raise TraceError(f"{self.source or 'trace'}: no delivery opportunities")
        if self.times_ms[-1] <= 0:
            raise TraceError(f"{self.source or 'trace'}: last timestamp must be > 0 (it is the period)")
        if self.times_ms[0] < 0 or any(b < a for a, b in zip(self.times_ms, self.times_ms[1:])):
            raise TraceError(f"{self.source or 'trace'}: timestamps must be >= 0 and non-decreasing")

    @property
    def period_s(self) -> float:
        return self.times_ms[-1] / 1000.0

    @property
    def per_period(self) -> int:
        return len(self.times_ms)

    @property
    def mean_rate_bps(self) -> float:
        """Average capacity in bits per second over one period."""
        return self.per_period * PACKET_BYTES * 8 / self.period_s

    def time_of(self, index: int) -> float:
        """Link time in seconds of opportunity `index` (counted over all repeats)."""
        assert index >= 0, index
        repeat, within = divmod(index, self.per_period)
        return (repeat * self.times_ms[-1] + self.times_ms[within]) / 1000.0

    def count_before(self, t_s: float) -> int:
        """Number of opportunities at link times strictly before `t_s` seconds."""
        if t_s <= 0:
            return 0
        period_ms = self.times_ms[-1]
        repeat, rest_ms = divmod(t_s * 1000.0, period_ms)
        repeat = int(repeat)
        count = bisect.bisect_left(self.times_ms, rest_ms)  # in the repeat that holds t
        if repeat >= 1:
            # The previous repeat ends at exactly repeat × period: its last opportunities are
            # not before t when t sits on that boundary.
            count += (repeat - 1) * self.per_period + bisect.bisect_left(self.times_ms, period_ms + rest_ms)
        return count

    def capacity_bytes(self, t0_s: float, t1_s: float) -> int:
        """Bytes the link can carry in link time [t0_s, t1_s): opportunities in it × 1500."""
        if t1_s <= t0_s:
            return 0
        return (self.count_before(t1_s) - self.count_before(t0_s)) * PACKET_BYTES


def parse_trace(text: str, source: str = "") -> Trace:
    times: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        try:
            times.append(int(line))
        except ValueError as exc:
            raise TraceError(f"{source or 'trace'}:{number}: not an integer millisecond: {line!r}") from exc
    return Trace(tuple(times), source)


def load_trace(path: Path | str) -> Trace:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise TraceError(f"trace file not found: {path}") from exc
    return parse_trace(text, str(path))
