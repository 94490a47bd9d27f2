"""The tests' one polling wait, for states that raise no event a test could wait on (a table's
size, a daemon's /healthz, a proxy's counters)."""
from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_TIMEOUT_S = 20.0  # any wait longer than this fails the test instead of hanging it
POLL_S = 0.005


def wait_for(condition: Callable[[], bool], what: str,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """Poll `condition` until it holds; return the seconds that took. After timeout_s the test
    fails with "timed out waiting for {what}"."""
    started = time.monotonic()
    while not condition():
        waited = time.monotonic() - started
        assert waited < timeout_s, f"timed out waiting for {what} ({timeout_s:g} s)"
        time.sleep(POLL_S)
    return time.monotonic() - started
