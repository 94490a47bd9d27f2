"""The verifier on the vLLM backend as a real process: `.venv-vllm/bin/tandem-cloud serve` on a
free loopback port (what the vLLM tests share)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / ".venv-vllm/bin/tandem-cloud"
START_TIMEOUT_S = 420   # engine start (~30-70 s here) plus warm-up, on a loaded 2-core host
needs_vllm = pytest.mark.skipif(
    not SERVE.exists(), reason=f"{SERVE.relative_to(ROOT)} is missing: the vLLM environment is "
    "made by scripts/bootstrap.sh --vllm (scripts/test.sh runs it)")


class VllmVerifier:
    """`.venv-vllm/bin/tandem-cloud serve` on a free loopback port; ready once it logs the
    `serving ... on 127.0.0.1:PORT` line (its output is drained by a thread, never slept on)."""

    def __init__(self, config: Path) -> None:
        self.process = subprocess.Popen(
            [str(SERVE), "serve", "--config", str(config), "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            start_new_session=True)
        self.lines: list[str] = []
        self.scoring_lines: list[str] = []  # "vLLM scoring:" lines: the path taken, fallbacks
        self._scoring_said = threading.Condition()
        self.port: int | None = None
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            del self.lines[:-400]  # vLLM logs a lot: keep the tail for failure messages
            if "vLLM scoring:" in line:
                with self._scoring_said:
                    self.scoring_lines.append(line.rstrip())
                    self._scoring_said.notify_all()
            match = re.search(r"serving .* on 127\.0\.0\.1:(\d+)", line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self.ready.set()
        self.ready.set()  # exited: wake the waiter, which sees no port

    @property
    def scoring(self) -> str | None:
        """The line saying which scoring path the engine took at start."""
        return self.scoring_lines[0] if self.scoring_lines else None

    def wait_for_scoring_line(self, text: str, timeout: float) -> bool:
        """Whether a "vLLM scoring:" line containing text comes within timeout seconds."""
        with self._scoring_said:
            return self._scoring_said.wait_for(
                lambda: any(text in line for line in self.scoring_lines), timeout)

    def wait_ready(self) -> int:
        if not self.ready.wait(START_TIMEOUT_S) or self.port is None:
            self.stop()
            tail = "\n".join(self.lines[-40:])
            raise AssertionError(f"the vLLM verifier did not start:\n{tail}")
        return self.port

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)  # the group this test started
                self.process.wait(timeout=30)
