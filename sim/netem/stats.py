"""What crossed the channel, as the proxy measured it: counters while running, snapshots to read."""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

MAX_DELAY_SAMPLES = 50_000  # per direction; older samples are dropped first


@dataclass
class DirectionCounters:
    """Mutable, owned by the proxy's event loop."""
    bytes_in: int = 0    # read from the sending endpoint
    bytes_out: int = 0   # written to the receiving endpoint
    chunks: int = 0      # reads
    delay_samples_ms: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_DELAY_SAMPLES))


@dataclass(frozen=True)
class DirectionStats:
    bytes_in: int
    bytes_out: int
    chunks: int
    packets: int          # 1500-byte pieces the link scheduled
    losses: int           # of those, lost (each one a retransmission stall)
    delay_samples_ms: tuple[float, ...]  # per chunk: last byte written − chunk read

    @property
    def delay_mean_ms(self) -> float:
        return statistics.fmean(self.delay_samples_ms) if self.delay_samples_ms else 0.0

    @property
    def delay_std_ms(self) -> float:
        return statistics.stdev(self.delay_samples_ms) if len(self.delay_samples_ms) > 1 else 0.0

    def delay_quantile_ms(self, q: float) -> float:
        assert 0.0 <= q <= 1.0, q
        if not self.delay_samples_ms:
            return 0.0
        ordered = sorted(self.delay_samples_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def summary(self) -> dict:
        return {"bytes_in": self.bytes_in, "bytes_out": self.bytes_out, "chunks": self.chunks,
                "packets": self.packets, "losses": self.losses,
                "delay_ms": {"n": len(self.delay_samples_ms), "mean": round(self.delay_mean_ms, 3),
                             "std": round(self.delay_std_ms, 3),
                             "p50": round(self.delay_quantile_ms(0.5), 3),
                             "p95": round(self.delay_quantile_ms(0.95), 3)}}


@dataclass(frozen=True)
class ProxyStats:
    uptime_s: float
    accepted: int          # connections relayed to the upstream
    active: int
    reset: int             # connections reset by an outage
    refused: int           # connections that arrived during an outage, reset at once
    upstream_failed: int   # connections whose upstream could not be reached
    in_outage: bool
    uplink: DirectionStats
    downlink: DirectionStats

    def summary(self) -> dict:
        return {"uptime_s": round(self.uptime_s, 3), "accepted": self.accepted, "active": self.active,
                "reset": self.reset, "refused": self.refused, "upstream_failed": self.upstream_failed,
                "in_outage": self.in_outage,
                "uplink": self.uplink.summary(), "downlink": self.downlink.summary()}
