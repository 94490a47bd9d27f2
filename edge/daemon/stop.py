"""Stop strings over streamed text.

OpenAI's `stop` ends the output *before* the first occurrence of any stop string, and the stop
string itself is not returned. While streaming, text that could still turn into a stop string
(a suffix that is a prefix of one) is held back until it either completes the stop string or
can no longer do so.
"""
from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        assert all(stops), "stop strings must be non-empty"
        self._stops = list(stops)
        self._pending = ""   # text received but not yet released
        self.stopped = False

    def push(self, text: str) -> str:
        """Feed new text; return what may be released now. After a stop string is found,
        `stopped` is True and everything from it on is dropped."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        self._pending += text
        hits = [i for i in (self._pending.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self._pending = self._pending[:min(hits)], ""
            return out
        hold = self._held_suffix_length()
        out = self._pending[:len(self._pending) - hold]
        self._pending = self._pending[len(self._pending) - hold:]
        return out

    def flush(self) -> str:
        """End of generation without a stop: release what was held back."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def _held_suffix_length(self) -> int:
        """Length of the longest suffix of the pending text that is a proper prefix of a stop."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:n]):
                    best = n
                    break
        return best
