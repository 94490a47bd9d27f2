"""The one table, JSON and figure writer of the simulation and of every benchmark (bench/ uses
it too): a column table as text or markdown, a JSON file, a figure saved, and the session-trace
figure (one generation's rounds over time) that both the simulation and `tandem bench` draw."""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Column = tuple[str, Callable[[Any], str]]  # header, the cell of a row


def text_table(columns: Sequence[Column], rows: Sequence[Any], *, left: int = 1,
               markdown: bool = False) -> str:
    """Rows under their headers, the first `left` columns flush left and the rest right (as
    numbers read); a markdown table with `markdown`."""
    cells = [[header for header, _ in columns]] + [[cell(row) for _, cell in columns] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in cells]
        lines.insert(1, "|" + "|".join("---" if i < left else "---:" for i in range(len(columns))) + "|")
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def finite(value):
    """JSON has no infinity or NaN: such a number (an unbounded interval end) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def write_json(path: Path, payload: dict | list, indent: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finite(payload), indent=indent, allow_nan=False) + "\n")


def pyplot():
    """matplotlib's pyplot on the file-only backend (loaded only when a figure is drawn)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def plot_session_trace(path: Path, title: str, t_s: Sequence[float], asked: Sequence[float],
                       accepted: Sequence[tuple[float, float]], rtt_ms: Sequence[float],
                       server_ms: Sequence[float] | None, server_label: str,
                       cloud_runs: Sequence[tuple[float, float]] = ()) -> Path:
    """One generation's rounds over time: the draft length asked and the accepted length
    ((t, n) points), cloud runs ((t, tokens)) if any, above the round trip and the verifier's
    part of it."""
    fig, (ax_k, ax_rtt) = pyplot().subplots(2, 1, figsize=(7, 5), sharex=True)
    ax_k.step(t_s, asked, where="post", label="draft length k")
    ax_k.plot([t for t, _ in accepted], [n for _, n in accepted], "o", ms=3, label="accepted n")
    if cloud_runs:  # runs the verifier generated itself (the adaptive controller's other option)
        ax_k.plot([t for t, _ in cloud_runs], [n for _, n in cloud_runs], "^", ms=5,
                  label="cloud run: tokens")
    ax_k.set_ylabel("tokens")
    ax_k.legend(loc="upper right", fontsize=8)
    ax_k.set_title(f"{title} ({len(t_s)} rounds)", fontsize=10)
    ax_rtt.plot(t_s, rtt_ms, ".-", label="round trip")
    if server_ms is not None:
        ax_rtt.plot(t_s, server_ms, ".", label=server_label)
    ax_rtt.set_ylabel("ms")
    ax_rtt.set_xlabel("seconds since the generation started")
    ax_rtt.legend(loc="upper right", fontsize=8)
    return save_figure(fig, path)
