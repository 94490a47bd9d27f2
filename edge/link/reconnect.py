"""Getting a stream to the verifier: one Open under the WaitRule, bounded retries with
exponential backoff and jitter, and what the request's offline mode says when the verifier
stays unreachable. A stop ends a backoff sleep or a wait at once (Stopped).
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence

from edge.config import ClientConfig
from edge.link.errors import (CloudUnavailable, LinkDown, Stopped, VerifierMisconfigured,
                              VerifierUnavailable)
from edge.link.offline import OfflineControl, OfflineMode
from edge.link.verifier_link import VerifierLink


class Reconnect:
    def __init__(self, link: VerifierLink, offline: OfflineControl, config: ClientConfig, *,
                 stopped: Callable[[], bool], stop_event: threading.Event | None = None,
                 jitter_rng: random.Random | None = None) -> None:
        self.link = link
        self.offline = offline
        self.config = config
        self.stopped = stopped
        self.stop_event = stop_event
        self.jitter_rng = jitter_rng or random.Random()

    def open(self, context: Sequence[int]) -> None:
        """One Open with the full context under the link's WaitRule. Raises LinkDown,
        VerifierRefused, Stopped."""
        self.link.open(context, self.offline.open_late_s(len(context)), self.config.open_timeout_s)

    def ensure_open(self, context: Sequence[int], backoff_first: bool = False) -> bool:
        """The one sequence every executor uses to (re-)open: open with retries, else what the
        request's offline mode says (require_verified raises, wait waits for the verifier).
        False: the verifier is given up on for now; the caller goes local."""
        return (self.open_with_retries(context, backoff_first=backoff_first)
                or self.reopen_if_waiting(context))

    def open_with_retries(self, context: Sequence[int], backoff_first: bool = False) -> bool:
        """Open with bounded retries, exponential backoff and jitter; False when the verifier
        stayed unreachable past the deadline (or the retries ran out). Raises CloudUnavailable
        instead when local generation is disabled."""
        cfg = self.config
        deadline = time.monotonic() + cfg.offline_after_s
        delay = cfg.retry_initial_backoff_s
        if backoff_first:
            self._sleep(delay)
            delay = min(delay * cfg.retry_multiplier, cfg.retry_max_backoff_s)
        failures = 0
        while True:
            self.check_configured()
            try:
                self.open(context)
                self.offline.opened(self.link)
                return True
            except LinkDown as error:
                failures += 1
                self.offline.failure(error)
                # The monitor says the verifier is down: waiting out the retries would only
                # pause the generation (it probes, and a probe re-opens once it answers).
                if (failures > cfg.max_retries or time.monotonic() + delay > deadline
                        or not self.offline.retry_now(failures)):
                    if not cfg.offline_enabled:
                        raise CloudUnavailable(f"verifier unreachable after {failures} "
                                               f"attempts: {error}") from error
                    return False
            self._sleep(delay)
            delay = min(delay * cfg.retry_multiplier, cfg.retry_max_backoff_s)

    def check_configured(self) -> None:
        """Raise VerifierMisconfigured when the monitor names a configuration cause."""
        cause = self.offline.misconfiguration()
        if cause:
            raise VerifierMisconfigured(cause)

    def reopen_if_waiting(self, context: Sequence[int]) -> bool:
        """The verifier stayed unreachable (the link is dropped): what the request's offline
        mode says. require_verified: raise VerifierUnavailable, naming the cause. wait: wait
        (at most offline_wait_s over the whole generation) until the verifier answers again and
        re-open: True when it did. continue, or the wait ran out: False (go on locally)."""
        self.check_configured()
        ctl = self.offline
        cause = ctl.breaker.reason or "the verifier is unreachable"
        if ctl.mode is OfflineMode.REQUIRE_VERIFIED:
            raise VerifierUnavailable(f"{cause}; this request requires verified tokens "
                                      "(offline: require_verified)")
        if ctl.mode is not OfflineMode.WAIT:
            return False
        while ctl.wait_s > 0:
            started = time.monotonic()
            try:
                up = ctl.wait_for_link(ctl.wait_s, self.stopped)
                if self.stopped():
                    raise Stopped()
                if not up:
                    break
                try:
                    self.open(context)
                except LinkDown as error:
                    ctl.failure(error)
                    continue
                ctl.opened(self.link)
                return True
            finally:
                # The budget is wall time: failed Opens spend it too, so a verifier that
                # answers probes but refuses every stream cannot hold the request forever.
                ctl.wait_s -= time.monotonic() - started
        ctl.wait_s = 0.0
        return False

    def _sleep(self, delay: float) -> None:
        """Backoff sleep with jitter; a stop ends it at once."""
        jitter = self.config.retry_jitter
        seconds = max(delay * (1.0 + self.jitter_rng.uniform(-jitter, jitter)), 0.0)
        if self.stop_event is not None:
            if self.stop_event.wait(seconds):
                raise Stopped()
        else:
            time.sleep(seconds)
        if self.stopped():
            raise Stopped()
