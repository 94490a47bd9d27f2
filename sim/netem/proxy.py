"""Asyncio TCP proxy that makes a loopback connection look like the profile's channel.

    client ──uplink──▶ ChannelProxy ──▶ upstream       (edge → cloud)
    client ◀─downlink─ ChannelProxy ◀── upstream       (cloud → edge)

Each accepted connection opens its own connection to the upstream and runs two pumps, one
per direction: a reader that takes a chunk off one socket when the direction's bottleneck
buffer has room, asks `DirectionLink.send` when each piece of it may be delivered, and queues
the pieces; and a deliverer that sleeps until each piece is due and writes it to the other
socket. It is byte-transparent, so HTTP/2 (gRPC) runs through it unchanged.

Outages: at the start of a window every open connection is reset (SO_LINGER 0, so the peer
sees RST, not a clean close), and connections that arrive inside a window are reset at once.

Not emulated: the TCP handshake's round trip (a client's connect completes at the proxy at
once; its first bytes still pay the delay) and packet loss that TCP could not hide.

Use it inside a running loop (`await open()` / `await aclose()`) or from synchronous code
(`start()` / `stop()`, which run the loop in a background thread).
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections import deque

from sim.netem.link import Direction, DirectionLink, StreamClock
from sim.netem.profile import ChannelProfile
from sim.netem.stats import DirectionCounters, DirectionStats, ProxyStats
from sim.netem.trace import PACKET_BYTES

READ_BYTES = 64 * 1024
UPSTREAM_CONNECT_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
DRAIN_TIMEOUT_S = 10.0            # rewind() waits this long at most for the link to go idle


def reset_transport(writer: asyncio.StreamWriter) -> None:
    """Close with RST: SO_LINGER {on, 0 s} makes the kernel drop the socket and reset the peer."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Relay:
    """One client connection and its upstream connection, shaped both ways."""

    def __init__(self, proxy: "ChannelProxy", client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]):
        self._proxy = proxy
        self._client = client
        self._upstream = upstream
        self._tasks: list[asyncio.Task] = []
        self.buffers: list[_PieceBuffer] = []   # both directions' pieces not yet delivered
        self.was_reset = False

    async def run(self) -> None:
        (client_r, client_w), (up_r, up_w) = self._client, self._upstream
        self._tasks = [asyncio.create_task(self._pump("uplink", client_r, up_w)),
                       asyncio.create_task(self._pump("downlink", up_r, client_w))]
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self.was_reset:
            for writer in (client_w, up_w):
                writer.close()

    def reset(self) -> None:
        """Reset both sockets and stop both pumps (an outage, or one side reset the connection)."""
        if self.was_reset:
            return
        self.was_reset = True
        reset_transport(self._client[1])
        reset_transport(self._upstream[1])
        for task in self._tasks:
            task.cancel()

    async def _pump(self, direction: Direction, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        proxy = self._proxy
        link, counters = proxy.links[direction], proxy.counters[direction]
        clock = StreamClock()
        buffer = _PieceBuffer()
        self.buffers.append(buffer)
        deliverer = asyncio.create_task(self._deliver(counters, writer, buffer))
        self._tasks.append(deliverer)
        try:
            while True:
                now = proxy.now()
                admit = link.admit_at(now)
                if admit > now:
                    await asyncio.sleep(admit - now)
                # A receiver that stops reading must not make this stream buffer without bound.
                while buffer.pending_bytes >= link.queue_bytes:
                    buffer.room.clear()
                    await buffer.room.wait()
                budget = max(PACKET_BYTES, link.queue_bytes - link.queued_bytes(proxy.now()))
                data = await reader.read(min(READ_BYTES, budget))
                if not data:
                    break
                arrival = proxy.now()
                counters.bytes_in += len(data)
                counters.chunks += 1
                offset = 0
                scheduled = link.send(clock, arrival, len(data))
                for i, piece in enumerate(scheduled):
                    last = i == len(scheduled) - 1
                    buffer.put((piece.deliver_at, data[offset:offset + piece.nbytes],
                                arrival if last else None))
                    offset += piece.nbytes
                assert offset == len(data), (offset, len(data))
            buffer.put(None)
            await deliverer
        except OSError:
            # The sender reset its connection: the receiver's connection goes too, so that the
            # endpoints see what they would see without the proxy.
            self.reset()

    async def _deliver(self, counters: DirectionCounters, writer: asyncio.StreamWriter,
                       buffer: "_PieceBuffer") -> None:
        proxy = self._proxy
        try:
            while True:
                while not buffer.pieces:
                    buffer.have_piece.clear()
                    await buffer.have_piece.wait()
                item = buffer.pieces[0]
                if item is None:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                deliver_at, data, read_at = item
                wait = deliver_at - proxy.now()
                if wait > 0:
                    await asyncio.sleep(wait)
                buffer.take()
                writer.write(data)
                counters.bytes_out += len(data)
                if read_at is not None:
                    counters.delay_samples_ms.append((proxy.now() - read_at) * 1000.0)
                await writer.drain()
        except OSError:
            self.reset()


class _PieceBuffer:
    """Pieces of one stream read but not yet written, in order; None marks end of stream."""

    def __init__(self) -> None:
        self.pieces: deque[tuple[float, bytes, float | None] | None] = deque()  # (due, data, read at)
        self.pending_bytes = 0
        self.have_piece = asyncio.Event()
        self.room = asyncio.Event()

    def put(self, item: tuple[float, bytes, float | None] | None) -> None:
        self.pieces.append(item)
        if item is not None:
            self.pending_bytes += len(item[1])
        self.have_piece.set()

    def take(self) -> None:
        item = self.pieces.popleft()
        assert item is not None
        self.pending_bytes -= len(item[1])
        self.room.set()

    def last_due(self) -> float | None:
        """When the last piece still queued is due (None: none is)."""
        due = [item[0] for item in self.pieces if item is not None]
        return max(due) if due else None


class ChannelProxy:
    """TCP proxy from `listen` to `upstream` through the channel of `profile`."""

    def __init__(self, profile: ChannelProfile, upstream: tuple[str, int],
                 listen: tuple[str, int] = ("127.0.0.1", 0)):
        self.profile = profile
        self.upstream = upstream
        self.listen = listen
        self.links: dict[Direction, DirectionLink] = {
            "uplink": DirectionLink.from_profile(profile, "uplink"),
            "downlink": DirectionLink.from_profile(profile, "downlink")}
        self.counters: dict[Direction, DirectionCounters] = {
            "uplink": DirectionCounters(), "downlink": DirectionCounters()}
        self.accepted = self.reset_count = self.refused = self.upstream_failed = 0
        self.address: tuple[str, int] | None = None
        self.epoch: float | None = None  # time.monotonic() at which proxy time 0 began
        self.shift_s = 0.0               # link time = proxy time + shift_s (rewind)
        self._relays: set[_Relay] = set()
        self._handlers: set[asyncio.Task] = set()
        self._server: asyncio.base_events.Server | None = None
        self._outage_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop_requested: asyncio.Event | None = None

    # ---- link time -------------------------------------------------------------------------
    def now(self) -> float:
        """Proxy time: seconds since the proxy started (the time base of every scheduled piece)."""
        assert self.epoch is not None, "proxy not started"
        return time.monotonic() - self.epoch

    def link_time(self) -> float:
        """Where the channel is on its own timeline (traces, outages): proxy time, unless a
        rewind() moved it."""
        return self.now() + self.shift_s

    def rewind(self, link_time_s: float, seed: str = "") -> None:
        """Put the channel at `link_time_s` of its timeline now, with jitter and loss draws
        started afresh from `seed` (profile seed if empty): a bench replays the same stretch
        of a trace for every configuration. Call it between requests; open connections stay
        open. From another thread (the proxy in its own), it first lets what the last request
        left in flight be delivered on the old timeline (at most DRAIN_TIMEOUT_S): a gRPC
        stream's closing frames, sent into a trace's silent gap, would otherwise hold up the
        next request on that connection until the gap's end (measured on lte at offset 0:
        every configuration but a unit's first started ~0.7 s late)."""
        loop = self._loop
        if self._thread is not None and loop is not None and loop.is_running() \
                and threading.current_thread() is not self._thread:
            async def on_loop() -> None:
                await self._drain(DRAIN_TIMEOUT_S)
                self._rewind(link_time_s, seed)
            asyncio.run_coroutine_threadsafe(on_loop(), loop).result(
                DRAIN_TIMEOUT_S + STOP_TIMEOUT_S)
        else:
            self._rewind(link_time_s, seed)

    async def _drain(self, timeout_s: float) -> None:
        """Wait until every piece queued on any connection has been delivered."""
        give_up = self.now() + timeout_s
        while self.now() < give_up:
            due = [d for relay in self._relays for b in relay.buffers
                   if (d := b.last_due()) is not None]
            if not due:
                return
            await asyncio.sleep(min(max(due), give_up) - self.now() + 1e-3)

    def _rewind(self, link_time_s: float, seed: str) -> None:
        now = self.now()
        self.shift_s = link_time_s - now
        for link in self.links.values():
            link.restart(link_time_s, now, seed or str(self.profile.seed))
        if self._outage_task is not None:  # its next window moved with the timeline
            self._outage_task.cancel()
            self._outage_task = asyncio.get_running_loop().create_task(self._run_outages())

    # ---- inside an event loop --------------------------------------------------------------
    async def open(self) -> tuple[str, int]:
        self._loop = asyncio.get_running_loop()
        self.epoch = time.monotonic()
        host, port = self.listen
        self._server = await asyncio.start_server(self._on_client, host, port)
        self.address = self._server.sockets[0].getsockname()[:2]
        self._outage_task = asyncio.create_task(self._run_outages())
        return self.address

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._outage_task is not None:
            self._outage_task.cancel()
        for relay in list(self._relays):
            relay.reset()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=STOP_TIMEOUT_S)
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_client(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            await self._relay(client_r, client_w)
        finally:
            self._handlers.discard(task)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.profile.in_outage(self.link_time()):
            self.refused += 1
            reset_transport(client_w)
            return
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(*self.upstream),
                                              UPSTREAM_CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            self.upstream_failed += 1
            reset_transport(client_w)
            return
        if self.profile.in_outage(self.link_time()):  # the window opened while we were connecting
            self.refused += 1
            reset_transport(client_w)
            reset_transport(upstream[1])
            return
        self.accepted += 1
        relay = _Relay(self, (client_r, client_w), upstream)
        self._relays.add(relay)
        try:
            await relay.run()
        finally:
            self._relays.discard(relay)

    async def _run_outages(self) -> None:
        while True:
            start = self.profile.next_outage_start(self.link_time())
            if start is None:
                return
            # asyncio may wake a timer up to its clock resolution early: sleep until truly past.
            while self.link_time() <= start:
                await asyncio.sleep(start - self.link_time() + 1e-4)
            for relay in list(self._relays):
                relay.reset()
                self.reset_count += 1

    def _snapshot(self) -> ProxyStats:
        def direction(name: Direction) -> DirectionStats:
            c, link = self.counters[name], self.links[name]
            return DirectionStats(bytes_in=c.bytes_in, bytes_out=c.bytes_out, chunks=c.chunks,
                                  packets=link.packets, losses=link.losses,
                                  delay_samples_ms=tuple(c.delay_samples_ms))
        uptime = self.now() if self.epoch is not None else 0.0
        return ProxyStats(uptime_s=uptime, accepted=self.accepted, active=len(self._relays),
                          reset=self.reset_count, refused=self.refused,
                          upstream_failed=self.upstream_failed,
                          in_outage=self.profile.in_outage(uptime + self.shift_s),
                          uplink=direction("uplink"), downlink=direction("downlink"))

    # ---- from synchronous code -------------------------------------------------------------
    def stats(self) -> ProxyStats:
        """A consistent snapshot, taken on the proxy's loop when it runs in another thread."""
        loop = self._loop
        if self._thread is not None and loop is not None and loop.is_running() \
                and threading.current_thread() is not self._thread:
            async def snapshot() -> ProxyStats:
                return self._snapshot()
            return asyncio.run_coroutine_threadsafe(snapshot(), loop).result(STOP_TIMEOUT_S)
        return self._snapshot()

    def start(self) -> tuple[str, int]:
        """Run the proxy's event loop in a background thread; returns the listening address."""
        assert self._thread is None, "already started"
        ready = threading.Event()
        failure: list[BaseException] = []

        async def serve() -> None:
            self._stop_requested = asyncio.Event()
            try:
                await self.open()
            except OSError as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            await self._stop_requested.wait()
            await self.aclose()

        self._thread = threading.Thread(target=asyncio.run, args=(serve(),), name="channel-proxy",
                                        daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        assert self.address is not None
        return self.address

    def stop(self) -> None:
        if self._thread is None:
            return
        assert self._loop is not None and self._stop_requested is not None
        self._loop.call_soon_threadsafe(self._stop_requested.set)
        self._thread.join(STOP_TIMEOUT_S + 5)
        self._thread = None

    def __enter__(self) -> "ChannelProxy":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
