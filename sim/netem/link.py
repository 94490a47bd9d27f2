"""One direction of the emulated channel as pure timing logic: bytes in at an arrival time,
pieces out with the time each may be delivered. No sockets here; the proxy only sleeps until
those times and writes.

For every 1500-byte packet of a chunk read at link time `arrival` (seconds since the link
started):
    finish    = when the bottleneck has serialised it (constant rate, or the next mahimahi
                delivery opportunity with room; the bottleneck is shared by all connections
                of this direction, like one radio link)
    deliver   = finish + delay + jitter (normal, clipped at zero total delay)
                + loss_stall if the packet is lost (a TCP retransmission, seen by the
                  application as a stall)
    deliver   = max(deliver, previous packet of the same stream)   # TCP never reorders bytes
Packets of one stream due within TICK_S of each other are merged into one piece, so a fast
link costs a write per millisecond rather than a write per packet.
"""
from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from sim.netem.profile import ChannelProfile, LinkSpec
from sim.netem.trace import PACKET_BYTES, Trace

Direction = Literal["uplink", "downlink"]
TICK_S = 0.001


@dataclass(frozen=True)
class Piece:
    """Consecutive bytes of one chunk that may be delivered together."""
    deliver_at: float  # link seconds: never earlier than any packet in it is due
    nbytes: int


@dataclass
class StreamClock:
    """Per-stream (one connection, one direction) state: the ordering constraint."""
    last_delivery: float = -math.inf


class Bottleneck(ABC):
    """Serialises packets in arrival order; `serialise` returns when the last byte is through."""

    @abstractmethod
    def serialise(self, arrival_s: float, nbytes: int) -> float: ...

    @abstractmethod
    def restart(self) -> None:
        """Forget what is queued: the link's clock is about to jump (DirectionLink.restart)."""


class RateBottleneck(Bottleneck):
    def __init__(self, rate_bps: float):
        assert rate_bps > 0, rate_bps
        self.rate_bps = rate_bps
        self._busy_until = -math.inf

    def serialise(self, arrival_s: float, nbytes: int) -> float:
        start = max(arrival_s, self._busy_until)
        self._busy_until = start + nbytes * 8 / self.rate_bps
        return self._busy_until

    def restart(self) -> None:
        self._busy_until = -math.inf


class TraceBottleneck(Bottleneck):
    """Mahimahi semantics: each opportunity carries up to 1500 queued bytes; an opportunity that
    finds the queue empty is lost, as is what is left of one when the queue runs dry."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self._next = 0               # index of the opportunity now filling
        self._left = PACKET_BYTES    # bytes it can still carry

    def serialise(self, arrival_s: float, nbytes: int) -> float:
        assert 0 < nbytes, nbytes
        if self.trace.time_of(self._next) < arrival_s:
            self._next = self.trace.count_before(arrival_s)
            self._left = PACKET_BYTES
        while True:
            take = min(nbytes, self._left)
            nbytes -= take
            self._left -= take
            finish = self.trace.time_of(self._next)
            if self._left == 0:
                self._next += 1
                self._left = PACKET_BYTES
            if nbytes == 0:
                return finish

    def restart(self) -> None:
        self._next, self._left = 0, PACKET_BYTES


def make_bottleneck(spec: LinkSpec) -> Bottleneck:
    if spec.rate_mbps is not None:
        return RateBottleneck(spec.rate_mbps * 1e6)
    return TraceBottleneck(spec.load_trace())


@dataclass
class DirectionLink:
    """One direction of the channel, shared by every connection through the proxy."""
    bottleneck: Bottleneck
    delay_s: float
    jitter_s: float
    loss: float
    stall_s: float
    queue_bytes: int
    rng: random.Random
    direction: Direction = "uplink"
    shift_s: float = 0.0    # link time (of the trace, the outages) = proxy time + shift_s
    packets: int = 0
    losses: int = 0
    _backlog: deque[tuple[float, int]] = field(default_factory=deque)  # (serialised at, bytes)
    _backlog_bytes: int = 0

    @classmethod
    def from_profile(cls, profile: ChannelProfile, direction: Direction) -> "DirectionLink":
        spec = profile.uplink if direction == "uplink" else profile.downlink
        return cls(bottleneck=make_bottleneck(spec), delay_s=profile.delay_ms / 1000,
                   jitter_s=profile.jitter_ms / 1000, loss=profile.loss,
                   stall_s=profile.stall_ms / 1000, queue_bytes=profile.queue_bytes,
                   # One seeded stream per direction, so a run is reproducible from the profile.
                   rng=random.Random(f"{profile.seed}:{direction}"), direction=direction)

    def restart(self, link_time_s: float, now_s: float, seed: str) -> None:
        """From proxy time `now_s` on, the link is at `link_time_s` of its timeline (a trace
        offset) with fresh jitter and loss draws from `seed`: what lets every configuration of a
        bench unit meet the same conditions. Call it while the link is idle: the bottleneck
        forgets what it was serialising."""
        self.shift_s = link_time_s - now_s
        self.bottleneck.restart()
        self.rng = random.Random(f"{seed}:{self.direction}")

    def queued_bytes(self, now_s: float) -> int:
        """Bytes accepted but not yet through the bottleneck at `now_s`."""
        while self._backlog and self._backlog[0][0] <= now_s:
            self._backlog_bytes -= self._backlog.popleft()[1]
        return self._backlog_bytes

    def admit_at(self, now_s: float) -> float:
        """Earliest time >= now_s at which the bottleneck's buffer has room again."""
        remaining = self.queued_bytes(now_s)
        if remaining < self.queue_bytes:
            return now_s
        for finish, nbytes in self._backlog:
            remaining -= nbytes
            if remaining < self.queue_bytes:
                return finish
        raise AssertionError("an empty backlog is below any queue limit")

    def send(self, stream: StreamClock, arrival_s: float, nbytes: int) -> list[Piece]:
        """Schedule `nbytes` read at `arrival_s`; returns pieces in order, summing to nbytes."""
        assert nbytes > 0, nbytes
        pieces: list[Piece] = []
        group_start = -math.inf
        for offset in range(0, nbytes, PACKET_BYTES):
            size = min(PACKET_BYTES, nbytes - offset)
            finish = self.bottleneck.serialise(arrival_s + self.shift_s, size) - self.shift_s
            self._backlog.append((finish, size))
            self._backlog_bytes += size
            deliver = finish + self._one_way_delay()
            self.packets += 1
            if self.loss and self.rng.random() < self.loss:
                self.losses += 1
                deliver += self.stall_s
            deliver = max(deliver, stream.last_delivery)
            stream.last_delivery = deliver
            if pieces and deliver - group_start <= TICK_S:
                pieces[-1] = Piece(deliver, pieces[-1].nbytes + size)
            else:
                pieces.append(Piece(deliver, size))
                group_start = deliver
        return pieces

    def _one_way_delay(self) -> float:
        if not self.jitter_s:
            return self.delay_s
        return max(0.0, self.rng.gauss(self.delay_s, self.jitter_s))
