"""The link emulator: trace and link timing as pure functions, then the real proxy between real
loopback sockets, checked against its profile (delay and throughput within 10%, jitter, loss
stalls, outages) and against what the endpoints themselves counted; gRPC runs through it."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sim.netem import (PACKET_BYTES, ChannelProfile, ChannelProxy, LinkSpec, OutageWindow,
                           TraceError, load_profile, load_trace, parse_trace)
from sim.netem.link import DirectionLink, StreamClock
from tandem.config import ConfigError
from waiting import wait_for

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
CHANNELS = ROOT / "configs/channels"
ATT_UP = "configs/channels/traces/ATT-LTE-driving-2016.up"
TIMEOUT_S = 10.0  # no socket operation in these tests should ever take this long


# ---- loopback endpoints ----------------------------------------------------------------------

class LoopbackServer:
    """A real TCP server on 127.0.0.1:0 that runs `handle(conn)` in a thread per connection and
    counts the bytes it received."""

    def __init__(self, handle: Callable[["LoopbackServer", socket.socket], None]):
        self._handle = handle
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.address = self._sock.getsockname()
        self.received = 0
        self.sent = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    def count(self, received: int = 0, sent: int = 0) -> None:
        with self._lock:
            self.received += received
            self.sent += sent

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(TIMEOUT_S)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._handle(self, conn)
            except OSError:
                pass  # the proxy reset the connection (outage tests): nothing to serve any more

    def close(self) -> None:
        self._stopping.set()
        self._acceptor.join(TIMEOUT_S)
        self._sock.close()
        for thread in self._threads:
            thread.join(TIMEOUT_S)


def echo(server: LoopbackServer, conn: socket.socket) -> None:
    while data := conn.recv(65536):
        server.count(received=len(data))
        conn.sendall(data)
        server.count(sent=len(data))


class Sink:
    """Receives until EOF, logging (monotonic time, bytes so far) for throughput over windows."""

    def __init__(self) -> None:
        self.log: list[tuple[float, int]] = []
        self.data = bytearray()
        self.done = threading.Event()

    def __call__(self, server: LoopbackServer, conn: socket.socket) -> None:
        while data := conn.recv(65536):
            self.data += data
            self.log.append((time.monotonic(), len(self.data)))
            server.count(received=len(data))
        self.done.set()


def connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise ConnectionError(f"EOF after {len(got)} of {n} bytes")
        got += chunk
    return bytes(got)


def round_trip_ms(sock: socket.socket, payload: bytes) -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return (time.monotonic() - start) * 1000.0


def profile(**fields) -> ChannelProfile:
    fields.setdefault("uplink", LinkSpec(rate_mbps=100.0))
    fields.setdefault("downlink", LinkSpec(rate_mbps=100.0))
    return ChannelProfile(name="test", **fields)


@pytest.fixture
def echo_server():
    server = LoopbackServer(echo)
    yield server
    server.close()


# ---- profiles and traces ---------------------------------------------------------------------

def test_shipped_profiles_load_with_their_promised_numbers():
    shipped = {p.stem: load_profile(p) for p in sorted(CHANNELS.glob("*.yaml"))}
    assert {"lan", "wifi", "lte", "3g", "flaky"} <= set(shipped)
    for name, prof in shipped.items():
        assert prof.name == name
    assert shipped["lan"].delay_ms == 0.5 and shipped["lan"].uplink.rate_mbps == 1000
    assert shipped["wifi"].delay_ms == 5 and shipped["wifi"].jitter_ms == 2 and shipped["wifi"].loss > 0
    assert shipped["3g"].downlink.rate_mbps == 1.0 and shipped["3g"].uplink.rate_mbps == 0.4
    for name in ("lte", "flaky"):  # real traces, shipped in the repository beside their notice
        for spec in (shipped[name].uplink, shipped[name].downlink):
            assert spec.trace_path().is_relative_to(CHANNELS / "traces")
            assert spec.load_trace().per_period > 10_000
    assert (CHANNELS / "traces/NOTICE.md").read_text().count("GPL-3.0")
    flaky = shipped["flaky"]
    assert not flaky.in_outage(7.9) and flaky.in_outage(8.0) and flaky.in_outage(10.9)
    assert not flaky.in_outage(11.0) and flaky.in_outage(38.5)


def test_profile_schema_rejects_contradictions(tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        LinkSpec(rate_mbps=5.0, trace=ATT_UP)
    with pytest.raises(ValueError, match="exactly one"):
        LinkSpec()
    with pytest.raises(ValueError, match="not found"):
        LinkSpec(trace="configs/channels/traces/no-such-trace.up")
    with pytest.raises(ValueError, match="period_s"):
        OutageWindow(start_s=1.0, duration_s=5.0, period_s=5.0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndelay_ms: 5\nbandwidth: 3\n")
    with pytest.raises(ConfigError, match="bandwidth"):
        load_profile(bad)
    bad.write_text("name: x\nloss: 1.5\n")
    with pytest.raises(ConfigError, match="loss"):
        load_profile(bad)


def test_outage_windows_repeat_and_announce_their_next_start():
    prof = profile(outages=[OutageWindow(start_s=2.0, duration_s=1.0, period_s=10.0),
                            OutageWindow(start_s=5.0, duration_s=0.5)])
    assert [prof.in_outage(t) for t in (1.99, 2.0, 2.99, 3.0, 5.2, 5.5, 12.5, 22.0)] == \
        [False, True, True, False, True, False, True, True]
    assert prof.next_outage_start(0.0) == 2.0
    assert prof.next_outage_start(2.5) == 5.0
    assert prof.next_outage_start(5.1) == 12.0
    assert profile().next_outage_start(0.0) is None


def test_trace_parsing_repeats_with_the_last_timestamp_as_period():
    trace = parse_trace("0\n0\n4\n\n10\n")
    assert trace.period_s == 0.010 and trace.per_period == 4
    assert [trace.time_of(i) for i in range(9)] == \
        [0.0, 0.0, 0.004, 0.010, 0.010, 0.010, 0.014, 0.020, 0.020]
    # count_before is the inverse of time_of: opportunities strictly before t
    for t in (0.0, 0.001, 0.004, 0.0041, 0.010, 0.0101, 0.020, 0.035):
        assert trace.count_before(t) == sum(1 for i in range(40) if trace.time_of(i) < t), t
    assert trace.capacity_bytes(0.0, 0.010) == 3 * PACKET_BYTES
    # 100 periods, less the one opportunity sitting exactly at 1.0 s (the 100th period's end)
    assert trace.capacity_bytes(0.0, 1.0) == (100 * 4 - 1) * PACKET_BYTES
    assert trace.mean_rate_bps == pytest.approx(4 * 1500 * 8 / 0.010)
    for text, message in (("", "no delivery"), ("0\n0\n", "period"), ("5\n3\n", "non-decreasing"),
                          ("1\nabc\n", "not an integer")):
        with pytest.raises(TraceError, match=message):
            parse_trace(text)
    with pytest.raises(TraceError, match="not found"):
        load_trace(ROOT / "no-such.trace")


def test_shipped_trace_capacity_matches_its_lines():
    trace = load_trace(ROOT / ATT_UP)
    lines = [line for line in (ROOT / ATT_UP).read_text().split() if line]
    assert trace.per_period == len(lines) and trace.period_s == int(lines[-1]) / 1000
    # [0, period): every line but those at the period itself, which coincide with the next repeat's 0s
    in_one_period = sum(1 for line in lines if int(line) < int(lines[-1])) * PACKET_BYTES
    assert trace.capacity_bytes(0.0, trace.period_s) == in_one_period
    assert trace.capacity_bytes(trace.period_s + 0.5, trace.period_s + 1.5) == trace.capacity_bytes(0.5, 1.5)
    first_second = sum(1 for line in lines if int(line) < 1000) * PACKET_BYTES
    assert trace.capacity_bytes(0.0, 1.0) == first_second


# ---- the link as pure timing logic ------------------------------------------------------------

def delivered_by(pieces, t_s: float) -> int:
    return sum(p.nbytes for p in pieces if p.deliver_at <= t_s)


def test_rate_link_serialises_at_its_rate_after_the_delay():
    link = DirectionLink.from_profile(profile(delay_ms=20.0, uplink=LinkSpec(rate_mbps=8.0),
                                              queue_bytes=10**7), "uplink")
    pieces = link.send(StreamClock(), 0.0, 1_000_000)
    assert sum(p.nbytes for p in pieces) == 1_000_000
    assert pieces[-1].deliver_at == pytest.approx(0.020 + 1.0)
    assert delivered_by(pieces, 0.020 + 0.5) == pytest.approx(500_000, abs=2 * 1000)  # ≤ 1 ms of bytes
    assert link.queued_bytes(0.5) == pytest.approx(500_000, abs=PACKET_BYTES)
    assert link.queued_bytes(1.0) == 0


def test_trace_link_delivers_exactly_the_trace_capacity_when_saturated():
    link = DirectionLink.from_profile(profile(delay_ms=10.0, uplink=LinkSpec(trace=ATT_UP),
                                              queue_bytes=10**8), "uplink")
    trace = load_trace(ROOT / ATT_UP)
    pieces = link.send(StreamClock(), 0.0, 3_000_000)
    for t in (0.5, 1.0, 2.0, 3.0):
        assert delivered_by(pieces, t + 0.010) == trace.capacity_bytes(0.0, t + 1e-9)


def test_trace_link_wastes_opportunities_while_idle():
    link = DirectionLink.from_profile(profile(uplink=LinkSpec(trace=ATT_UP), queue_bytes=10**8), "uplink")
    trace = load_trace(ROOT / ATT_UP)
    pieces = link.send(StreamClock(), 1.0, 200_000)  # nothing was queued during [0, 1)
    assert pieces[0].deliver_at >= 1.0
    end = pieces[-1].deliver_at  # the opportunity that carried the last byte
    assert trace.capacity_bytes(1.0, end) < 200_000 <= trace.capacity_bytes(1.0, end + 1e-9)


def test_jitter_spreads_sparse_packets_and_never_reorders_dense_ones():
    link = DirectionLink.from_profile(profile(delay_ms=30.0, jitter_ms=6.0, seed=7), "uplink")
    sparse = [link.send(StreamClock(), 0.1 * i, 100)[0].deliver_at - 0.1 * i for i in range(2000)]
    assert statistics.fmean(sparse) == pytest.approx(0.030, abs=0.001)
    assert statistics.stdev(sparse) == pytest.approx(0.006, rel=0.1)
    stream = StreamClock()
    dense = [p.deliver_at for i in range(2000) for p in link.send(stream, 0.0001 * i, 3000)]
    assert dense == sorted(dense)


def test_loss_stalls_packets_at_the_configured_rate_and_holds_back_what_follows():
    link = DirectionLink.from_profile(profile(delay_ms=5.0, loss=0.05, loss_stall_ms=100.0), "uplink")
    stream = StreamClock()
    times = [link.send(stream, 0.01 * i, 100)[0].deliver_at - 0.01 * i for i in range(4000)]
    assert link.packets == 4000
    assert link.losses == pytest.approx(200, abs=4 * (4000 * 0.05 * 0.95) ** 0.5)
    stalled = [t for t in times if t > 0.05]
    assert len(stalled) >= link.losses  # a stalled packet also holds back the ones behind it
    assert max(times) == pytest.approx(0.005 + 0.100, abs=1e-4)  # one stall, not a pile-up


def test_queue_limit_admits_again_only_when_the_bottleneck_has_drained():
    link = DirectionLink.from_profile(profile(uplink=LinkSpec(rate_mbps=8.0), queue_bytes=100_000), "uplink")
    assert link.admit_at(0.0) == 0.0
    link.send(StreamClock(), 0.0, 300_000)  # 0.3 s of bytes at 1 MB/s
    assert link.admit_at(0.0) == pytest.approx(0.2 + 0.0015, abs=0.0016)
    assert link.admit_at(0.25) == 0.25


def test_restart_replays_the_same_stretch_of_trace_with_the_same_draws():
    """What a bench unit relies on: a link restarted at link time t0 with seed s delivers the
    same bytes at the same times after the restart, whenever (in proxy time) it happens and
    whatever the link carried before."""
    prof = profile(delay_ms=30.0, jitter_ms=5.0, loss=0.02, loss_stall_ms=50.0,
                   uplink=LinkSpec(trace=ATT_UP), queue_bytes=10**8)

    def replay(link: DirectionLink, now: float) -> list[tuple[float, int]]:
        link.restart(42.0, now, seed="unit-3")
        stream = StreamClock()
        return [(round(p.deliver_at - now, 9), p.nbytes)
                for i in range(40) for p in link.send(stream, now + 0.05 * i, 4000)]

    fresh = DirectionLink.from_profile(prof, "uplink")
    used = DirectionLink.from_profile(prof, "uplink")
    used.send(StreamClock(), 0.0, 2_000_000)            # busy earlier, at another stretch
    assert replay(fresh, 0.0) == replay(used, 17.3)
    trace = load_trace(ROOT / ATT_UP)
    assert replay(fresh, 0.0) != [(round(p.deliver_at, 9), p.nbytes) for p in
                                  DirectionLink.from_profile(prof, "uplink").send(StreamClock(), 0.0, 4000)]
    # saturated from the restart on, it carries exactly the trace's capacity from t0
    link = DirectionLink.from_profile(profile(uplink=LinkSpec(trace=ATT_UP), queue_bytes=10**8), "uplink")
    link.restart(42.0, 5.0, seed="x")
    pieces = link.send(StreamClock(), 5.0, 3_000_000)
    assert delivered_by(pieces, 6.0) == trace.capacity_bytes(42.0, 43.0 + 1e-9)


# ---- the proxy between real sockets -----------------------------------------------------------

def test_round_trip_delay_matches_the_profile(echo_server):
    with ChannelProxy(profile(delay_ms=50.0), upstream=echo_server.address) as proxy:
        with connect(proxy.address) as sock:
            rtts = [round_trip_ms(sock, b"%04d" % i * 16) for i in range(25)]
        stats = proxy.stats()
    assert statistics.median(rtts) / 2 == pytest.approx(50.0, rel=0.10)
    assert min(rtts) >= 100.0  # never early
    for direction in (stats.uplink, stats.downlink):
        assert len(direction.delay_samples_ms) == 25
        assert direction.delay_mean_ms == pytest.approx(50.0, rel=0.10)


def test_constant_rate_throughput_matches_each_direction():
    size = 2_000_000
    sink = Sink()

    def source(server: LoopbackServer, conn: socket.socket) -> None:
        conn.sendall(b"d" * size)
        server.count(sent=size)

    up = LoopbackServer(sink)
    down = LoopbackServer(source)
    try:
        prof = profile(delay_ms=10.0, uplink=LinkSpec(rate_mbps=8.0), downlink=LinkSpec(rate_mbps=16.0))
        with ChannelProxy(prof, upstream=up.address) as up_proxy:
            start = time.monotonic()
            with connect(up_proxy.address) as sock:
                sock.sendall(b"u" * size)
            assert sink.done.wait(TIMEOUT_S)
            up_s = sink.log[-1][0] - start - 0.010
            up_stats = up_proxy.stats()
        with ChannelProxy(prof, upstream=down.address) as down_proxy:
            start = time.monotonic()
            with connect(down_proxy.address) as sock:
                got = 0
                while chunk := sock.recv(65536):
                    got += len(chunk)
                    done = time.monotonic()
            down_s = done - start - 0.010
            assert got == size
    finally:
        up.close()
        down.close()
    assert size * 8 / up_s / 1e6 == pytest.approx(8.0, rel=0.10)
    assert size * 8 / down_s / 1e6 == pytest.approx(16.0, rel=0.10)
    # What the proxy counted is what the endpoints counted.
    assert up_stats.uplink.bytes_in == up_stats.uplink.bytes_out == up.received == size


def test_trace_throughput_matches_the_trace_capacity_over_a_window():
    sink = Sink()
    server = LoopbackServer(sink)
    delay_s = 0.010
    trace = load_trace(ROOT / ATT_UP)
    try:
        prof = profile(delay_ms=delay_s * 1000, uplink=LinkSpec(trace=ATT_UP), queue_bytes=200_000)
        with ChannelProxy(prof, upstream=server.address) as proxy:
            with connect(proxy.address) as sock:
                sock.settimeout(0.05)
                block = b"t" * 65536
                while proxy.now() < 2.6:  # keep the bottleneck's buffer full all through the window
                    try:
                        sock.sendall(block)
                    except TimeoutError:
                        pass
            epoch = proxy.epoch
    finally:
        server.close()
    t0, t1 = 0.5, 2.4  # link time of the window at the bottleneck

    def received_at(link_t: float) -> int:
        return max((n for t, n in sink.log if t - epoch <= link_t), default=0)

    measured = received_at(t1 + delay_s) - received_at(t0 + delay_s)
    expected = trace.capacity_bytes(t0, t1)
    assert expected > 500_000  # the window is not one of the trace's dead spots
    assert measured == pytest.approx(expected, rel=0.10)


def test_jitter_spreads_one_way_delay_and_keeps_bytes_in_order():
    sink = Sink()
    server = LoopbackServer(sink)
    message = 6
    sent_at: list[float] = []
    try:
        with ChannelProxy(profile(delay_ms=30.0, jitter_ms=8.0, seed=2), upstream=server.address) as proxy:
            with connect(proxy.address) as sock:
                for i in range(100):  # 30 ms apart: the ordering rule almost never binds
                    sent_at.append(time.monotonic())
                    sock.sendall(b"%06d" % i)
                    time.sleep(0.03)
                burst = bytes(random.Random(1).randbytes(300_000))  # dense: ordering always binds
                sock.sendall(burst)
            assert sink.done.wait(TIMEOUT_S)
    finally:
        server.close()
    assert bytes(sink.data) == b"".join(b"%06d" % i for i in range(100)) + burst
    # One-way delay of each message as the endpoints saw it: sent → its last byte received.
    received_at = [next(t for t, n in sink.log if n >= message * (i + 1)) for i in range(100)]
    one_way_ms = [(r - s) * 1000 for r, s in zip(received_at, sent_at)]
    assert min(one_way_ms) >= 0.0
    assert statistics.fmean(one_way_ms) == pytest.approx(30.0, rel=0.10)
    assert statistics.stdev(one_way_ms) == pytest.approx(8.0, rel=0.25)


def test_loss_adds_stalls_at_about_the_configured_rate(echo_server):
    prof = profile(delay_ms=5.0, loss=0.08, loss_stall_ms=60.0, seed=11)
    with ChannelProxy(prof, upstream=echo_server.address) as proxy:
        with connect(proxy.address) as sock:
            rtts = [round_trip_ms(sock, b"x" * 200) for _ in range(150)]
        stats = proxy.stats()
    losses = stats.uplink.losses + stats.downlink.losses
    assert stats.uplink.packets == stats.downlink.packets == 150
    expected = 2 * 150 * 0.08
    assert losses == pytest.approx(expected, abs=4 * expected ** 0.5)
    # A stalled round trip takes at least 60 ms more than a typical one; a scheduling hiccup on a
    # busy machine now and then takes a round trip past the threshold without a loss.
    stalled = [r for r in rtts if r > statistics.median(rtts) + 45.0]
    # One message is one packet each way; a round trip can lose both, which stalls it twice.
    assert len(stalled) - 2 <= losses <= 2 * len(stalled)
    single = sorted(stalled)[: len(stalled) // 2]
    assert statistics.median(single) == pytest.approx(10.0 + 60.0, rel=0.10)


def test_outage_resets_open_connections_refuses_new_ones_then_recovers(echo_server):
    prof = profile(delay_ms=2.0, outages=[OutageWindow(start_s=0.6, duration_s=0.8)])
    with ChannelProxy(prof, upstream=echo_server.address) as proxy:
        with connect(proxy.address) as before:
            round_trip_ms(before, b"before")
            # The open connection is reset (RST) when the window opens, not closed cleanly.
            with pytest.raises(ConnectionResetError):
                before.recv(16)
        assert proxy.now() == pytest.approx(0.6, abs=0.1)
        # The kernel completes the handshake, the proxy resets the connection at once: the reset
        # can reach the client while it is still in connect().
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            with connect(proxy.address) as during:
                during.sendall(b"during")
                during.recv(16)
        wait_for(lambda: proxy.now() >= 1.45, "the proxy clock at 1.45 s", TIMEOUT_S)
        with connect(proxy.address) as after:
            assert round_trip_ms(after, b"after") < 100
        stats = proxy.stats()
    assert stats.reset == 1 and stats.refused == 1 and stats.accepted == 2


def test_rewind_moves_the_outage_schedule_with_the_timeline(echo_server):
    prof = profile(delay_ms=2.0, outages=[OutageWindow(start_s=100.0, duration_s=0.5)])
    with ChannelProxy(prof, upstream=echo_server.address) as proxy:
        with connect(proxy.address) as before:
            round_trip_ms(before, b"before")
            proxy.rewind(99.8)                          # 0.2 s before the window opens
            assert proxy.link_time() == pytest.approx(99.8, abs=0.05)
            with pytest.raises(ConnectionResetError):
                before.recv(16)
        proxy.rewind(3.0)                               # far from any window: accepted again
        with connect(proxy.address) as after:
            assert round_trip_ms(after, b"after") < 100
        stats = proxy.stats()
    assert stats.reset == 1 and stats.accepted == 2 and not stats.in_outage


def test_rewind_first_delivers_what_the_last_request_left_in_a_trace_gap(echo_server, tmp_path):
    """A request's last bytes (a gRPC stream's closing frames) sent into a trace's silent gap
    are delivered at the gap's end on the old timeline before rewind() moves the link, so the
    next request on that connection starts on time (before, the bench's second configuration
    of a unit at lte's offset 0 waited ~0.7 s for the gap)."""
    trace = tmp_path / "gap.up"  # an opportunity each ms for 0.2 s, none until 1.5 s, period 2 s
    trace.write_text("".join(f"{t}\n" for t in [*range(0, 200), *range(1500, 2001)]))
    prof = profile(delay_ms=5.0, uplink=LinkSpec(trace=str(trace)))
    with ChannelProxy(prof, upstream=echo_server.address) as proxy:
        with connect(proxy.address) as sock:
            proxy.rewind(0.0)
            assert round_trip_ms(sock, b"request") < 100
            wait_for(lambda: proxy.link_time() > 0.3, "link time inside the gap", TIMEOUT_S)
            sock.sendall(b"closing")                           # due at link time 1.5 s
            wait_for(lambda: proxy.stats().uplink.bytes_in == len(b"requestclosing"),
                     "every uplink byte in", TIMEOUT_S)
            proxy.rewind(0.0)
            assert recv_exactly(sock, 7) == b"closing"         # delivered before the rewind
            assert proxy.link_time() < 0.1
            assert round_trip_ms(sock, b"next request") < 100  # the same stretch, on time


def test_many_concurrent_connections_and_stats_equal_endpoint_counts(echo_server):
    payloads = [random.Random(i).randbytes(random.Random(i).randrange(1, 200_000)) for i in range(16)]

    def exchange(payload: bytes) -> bytes:
        with connect(proxy.address) as sock:
            sender = threading.Thread(target=sock.sendall, args=(payload,))
            sender.start()
            got = recv_exactly(sock, len(payload))
            sender.join(TIMEOUT_S)
            return got

    prof = profile(delay_ms=5.0, jitter_ms=1.0, uplink=LinkSpec(rate_mbps=200.0),
                   downlink=LinkSpec(rate_mbps=200.0))
    with ChannelProxy(prof, upstream=echo_server.address) as proxy:
        with ThreadPoolExecutor(len(payloads)) as pool:
            echoed = list(pool.map(exchange, payloads))
        wait_for(lambda: proxy.stats().active == 0, "no connection active", TIMEOUT_S)
        stats = proxy.stats()
    assert echoed == payloads
    total = sum(map(len, payloads))
    assert stats.accepted == len(payloads)
    assert stats.uplink.bytes_in == stats.uplink.bytes_out == echo_server.received == total
    assert stats.downlink.bytes_in == stats.downlink.bytes_out == echo_server.sent == total


def test_upstream_that_is_down_resets_the_client():
    unused = socket.create_server(("127.0.0.1", 0))
    address = unused.getsockname()
    unused.close()  # nothing listens there now
    with ChannelProxy(profile(), upstream=address) as proxy:
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            with connect(proxy.address) as sock:
                sock.sendall(b"hello")
                sock.recv(16)
        assert proxy.stats().upstream_failed == 1


def test_grpc_health_check_works_through_the_proxy():
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_servicer = health.HealthServicer()
    health_servicer.set("tandem", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with ChannelProxy(profile(delay_ms=20.0), upstream=("127.0.0.1", port)) as proxy:
            # No HTTP proxy from the environment: the link emulator is the only thing between.
            with grpc.insecure_channel("%s:%d" % proxy.address,
                                       options=[("grpc.enable_http_proxy", 0)]) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                stub.Check(health_pb2.HealthCheckRequest(service="tandem"), timeout=TIMEOUT_S)  # connect
                start = time.monotonic()
                reply = stub.Check(health_pb2.HealthCheckRequest(service="tandem"), timeout=TIMEOUT_S)
                elapsed_ms = (time.monotonic() - start) * 1000
            stats = proxy.stats()
    finally:
        server.stop(grace=None)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert elapsed_ms >= 40.0  # one round trip through the emulated link
    assert stats.accepted == 1 and stats.uplink.bytes_in > 0 and stats.downlink.bytes_in > 0


def test_cli_relays_prints_stats_and_stops_on_sigterm(echo_server):
    command = [sys.executable, "-m", "sim.netem", "--profile", str(CHANNELS / "lan.yaml"),
               "--listen", "127.0.0.1:0", "--upstream", "%s:%d" % echo_server.address,
               "--stats-every", "0.2"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        listening = json.loads(proc.stdout.readline())
        assert listening["event"] == "listening" and listening["profile"] == "lan"
        host, port = listening["listen"].rsplit(":", 1)
        with connect((host, int(port))) as sock:
            round_trip_ms(sock, b"ping" * 100)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert events[-1]["event"] == "stopped"
    assert events[-1]["uplink"]["bytes_in"] == 400 and events[-1]["downlink"]["bytes_out"] == 400


def test_cli_reports_a_bad_profile(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nrate: 3\n")
    proc = subprocess.run([sys.executable, "-m", "sim.netem", "--profile", str(bad),
                           "--upstream", "127.0.0.1:1"], capture_output=True, text=True, cwd=ROOT,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 2 and "rate" in proc.stderr
