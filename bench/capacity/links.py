"""Every emulated user's own link: one sim.netem.ChannelProxy per user, all on one event loop
in one thread (a hundred proxy threads would cost more than the links themselves).

Each proxy starts at its own point of the profile's trace (users spread over the trace's
period, so they do not all meet the same fade at once) with its own jitter and loss draws.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

from bench.matrix.channels import trace_period_s
from sim.netem import ChannelProfile, ChannelProxy

START_TIMEOUT_S = 30.0


def user_offset(profile: ChannelProfile, user: int, users: int) -> float:
    """Where on the trace user `user` of `users` starts: spread evenly over the period."""
    period = trace_period_s(profile)
    return 0.0 if period is None else round(user * period / max(1, users), 3)


class LinkFarm:
    """An event loop thread holding the users' channel proxies (and, for HTTP users, their
    coroutines)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxies: list[ChannelProxy] = []
        self._thread = threading.Thread(target=self.loop.run_forever, name="links", daemon=True)
        self._thread.start()

    def add(self, profile: ChannelProfile, upstream: tuple[str, int], offset_s: float,
            seed: str) -> tuple[str, int]:
        """A new proxy to `upstream` through `profile`, rewound to offset_s; its address."""
        proxy = ChannelProxy(profile, upstream=upstream)

        async def start() -> tuple[str, int]:
            address = await proxy.open()
            proxy.rewind(offset_s, seed=seed)
            return address

        address = self.submit(start()).result(START_TIMEOUT_S)
        self.proxies.append(proxy)
        return address

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def close(self) -> None:
        async def close_all() -> None:
            await asyncio.gather(*(p.aclose() for p in self.proxies), return_exceptions=True)

        try:
            self.submit(close_all()).result(START_TIMEOUT_S)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(START_TIMEOUT_S)
            self.proxies.clear()

    def __enter__(self) -> "LinkFarm":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
