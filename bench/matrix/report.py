"""The bench's rows and goals as a table (plain or markdown) and as JSON."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bench.matrix.goals import Goal, interval_text
from bench.matrix.results import BenchRow
from sim.writers import text_table
from sim.writers import write_json as write_json_file


COLUMNS = [  # header, BenchRow field, format
    ("channel", "channel", "{}"), ("device", "device", "{}"), ("config", "config", "{}"),
    ("verified tok/s", "tokens_per_s", "{:.1f}"), ("95% CI", "tokens_per_s_low", None),
    ("local tok/s", "local_tokens_per_s", "{:.1f}"),
    ("TTFT s", "ttft_s", "{:.3f}"),
    ("TPOT ms", "tpot_s", "{:.1f}"), ("tau", "tau", "{:.2f}"),
    ("passes/tok", "passes_per_token", "{:.3f}"), ("bytes/tok", "bytes_per_token", "{:.1f}"),
    ("mJ/tok", "joules_per_token", "{:.1f}"), ("agree", "agreement", "{:.1%}"),
    ("units", "units", "{}"),
]
_SCALE = {"tpot_s": 1000.0, "joules_per_token": 1000.0}


def _cell(r: BenchRow, name: str, fmt: str | None) -> str:
    value = getattr(r, name)
    if fmt is None:  # the interval column
        low, high = r.tokens_per_s_low, r.tokens_per_s_high
        return "-" if low is None or high is None else f"{low:.1f}-{high:.1f}"
    return value if isinstance(value, str) else fmt.format(value * _SCALE.get(name, 1.0))


def format_table(rows: Sequence[BenchRow], markdown: bool = False) -> str:
    columns = [(h, lambda r, name=name, fmt=fmt: _cell(r, name, fmt)) for h, name, fmt in COLUMNS]
    return text_table(columns, rows, left=3, markdown=markdown)


def format_goals(items: Sequence[Goal], markdown: bool = False) -> str:
    lines = []
    for g in items:
        value = interval_text(g.measured, g.low, g.high)
        lines.append(f"| {g.goal} | {value} | {g.verdict} | {g.detail} |" if markdown
                     else f"  [{g.verdict:>7}] {g.goal}: {value}  ({g.detail})")
    if markdown:
        lines[:0] = ["| goal | worst cell [95% CI] | verdict | per cell (vs the best other, verdict) |",
                     "|---|---:|---|---|"]
    return "\n".join(lines)


def write_json(path: Path, rows: Sequence[BenchRow], goal_list: Sequence[Goal], extra: dict) -> None:
    write_json_file(path, {"rows": [asdict(r) for r in rows], "goals": [asdict(g) for g in goal_list],
                           **extra})
