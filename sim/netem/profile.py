"""Channel profiles: what the emulated link between edge and cloud does to the bytes on it.

A profile is YAML under configs/channels/ validated into `ChannelProfile`. Vocabulary used by
the whole package:
- uplink: client → upstream (edge → cloud); downlink: upstream → client.
- delay: one-way propagation delay added to every packet, plus jitter (normal, std jitter_ms).
- capacity: how fast the bottleneck serialises bytes, a constant rate or a mahimahi trace.
- loss: probability that a packet-sized piece is lost; TCP hides a loss from the application
  as a retransmission stall, so the emulator holds that packet (and, the stream being in
  order, everything behind it) for `loss_stall_ms` more.
- outage: a window in which existing connections are reset and new ones are reset at once.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from sim.netem.trace import Trace, TraceError, load_trace
from tandem.config import Settings, load_config

REPO_ROOT = Path(__file__).resolve().parents[2]


class LinkSpec(Settings):
    """Capacity of one direction: exactly one of a constant rate or a trace file."""
    rate_mbps: float | None = Field(None, gt=0, le=100_000,
                                    description="constant capacity in megabits per second")
    trace: str | None = Field(None, description="mahimahi trace file (one ms timestamp per 1500-byte "
                                                "delivery opportunity); relative paths resolve "
                                                "against the repository root")

    @model_validator(mode="after")
    def _one_capacity(self) -> "LinkSpec":
        if (self.rate_mbps is None) == (self.trace is None):
            raise ValueError("give exactly one of rate_mbps or trace")
        if self.trace is not None and not self.trace_path().is_file():
            raise ValueError(f"trace file not found: {self.trace_path()}")
        return self

    def trace_path(self) -> Path:
        assert self.trace is not None
        path = Path(self.trace)
        return path if path.is_absolute() else REPO_ROOT / path

    def load_trace(self) -> Trace:
        try:
            return load_trace(self.trace_path())
        except TraceError as exc:
            raise ValueError(str(exc)) from exc


class OutageWindow(Settings):
    """The link is down in [start_s, start_s + duration_s), again every period_s if given."""
    start_s: float = Field(..., ge=0, le=1e6, description="seconds after the proxy starts")
    duration_s: float = Field(..., gt=0, le=1e6, description="length of the outage in seconds")
    period_s: float | None = Field(None, gt=0, le=1e6,
                                   description="repeat the outage every period_s seconds; None = once")

    @model_validator(mode="after")
    def _period_longer_than_outage(self) -> "OutageWindow":
        if self.period_s is not None and self.period_s <= self.duration_s:
            raise ValueError("period_s must be longer than duration_s (else the link never comes back)")
        return self

    def contains(self, t_s: float) -> bool:
        if t_s < self.start_s:
            return False
        offset = t_s - self.start_s
        if self.period_s is not None:
            offset %= self.period_s
        return offset < self.duration_s

    def next_start(self, t_s: float) -> float | None:
        """Earliest window start at or after t_s; None when the window does not come again."""
        if t_s <= self.start_s:
            return self.start_s
        if self.period_s is None:
            return None
        repeats = -(-(t_s - self.start_s) // self.period_s)  # ceil
        return self.start_s + repeats * self.period_s


class ChannelProfile(Settings):
    name: str = Field(..., min_length=1, description="short name, e.g. lte")
    description: str = Field("", description="what real link this imitates")
    delay_ms: float = Field(0.0, ge=0, le=10_000, description="one-way propagation delay")
    jitter_ms: float = Field(0.0, ge=0, le=10_000,
                             description="std of a normal variation of the one-way delay per packet; "
                                         "bytes of one stream are never reordered, so a packet never "
                                         "overtakes the one before it")
    uplink: LinkSpec = Field(default_factory=lambda: LinkSpec(rate_mbps=1000.0),
                             description="capacity client → upstream (edge → cloud)")
    downlink: LinkSpec = Field(default_factory=lambda: LinkSpec(rate_mbps=1000.0),
                               description="capacity upstream → client (cloud → edge)")
    loss: float = Field(0.0, ge=0, lt=1, description="probability that a 1500-byte piece is lost "
                                                     "(each direction); seen as a retransmission stall")
    loss_stall_ms: float | None = Field(None, ge=0, le=60_000,
                                        description="extra delay of a lost piece; None = one round "
                                                    "trip (2 × delay_ms, at least 10 ms), what fast "
                                                    "retransmit costs")
    outages: list[OutageWindow] = Field(default_factory=list,
                                        description="windows in which the link is down")
    queue_bytes: int = Field(256_000, ge=1500, le=1 << 30,
                             description="bottleneck buffer per direction; when it is full the proxy "
                                         "stops reading, so TCP flow control pushes back on the sender")
    seed: int = Field(0, ge=0, description="seed of the jitter and loss draws")

    @property
    def stall_ms(self) -> float:
        if self.loss_stall_ms is not None:
            return self.loss_stall_ms
        return max(2.0 * self.delay_ms, 10.0)

    def in_outage(self, t_s: float) -> bool:
        return any(window.contains(t_s) for window in self.outages)

    def next_outage_start(self, t_s: float) -> float | None:
        starts = [s for s in (w.next_start(t_s) for w in self.outages) if s is not None]
        return min(starts) if starts else None


def load_profile(path: Path | str) -> ChannelProfile:
    return load_config(path, ChannelProfile)
