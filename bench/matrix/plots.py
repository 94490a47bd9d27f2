"""The bench's PNG plots: tokens/s per configuration and profile (with 95% bootstrap intervals
over prompts as error bars), and one adaptive session on the LTE trace over time (draft length
k, accepted length, round-trip time)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from bench.matrix.results import BenchRow
from sim.writers import plot_session_trace, pyplot, save_figure


def write_plots(out_dir: Path, rows: Sequence[BenchRow], trace: Sequence[dict], trace_title: str) -> list[Path]:
    plt = pyplot()
    written: list[Path] = []

    profiles = list(dict.fromkeys((r.channel, r.device) for r in rows))
    configs = list(dict.fromkeys(r.config for r in rows))
    speed = {(r.channel, r.device, r.config): r.tokens_per_s for r in rows}
    row_of = {(r.channel, r.device, r.config): r for r in rows}
    cols = min(3, len(profiles))
    nrows = math.ceil(len(profiles) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 3.6 * nrows), squeeze=False)
    for ax, (channel, device) in zip(axes.flat, profiles):
        values = [speed.get((channel, device, c), 0.0) for c in configs]
        colors = ["#d9822b" if c.startswith("adaptive") else "#7a7a7a" if c == "oracle"
                  else "#3a7dc9" for c in configs]
        # The draft alone on a fast device runs far off the scale of the others: clip its bar
        # and print its value, so the configurations that matter stay readable.
        others = [v for c, v in zip(configs, values) if c != "edge-only"] or values
        top = max(others) * 1.25 if max(others) > 0 else 1.0
        bars = ax.bar(range(len(configs)), [min(v, top) for v in values], color=colors)
        # the 95% bootstrap interval over prompts, where it could be estimated (not clipped bars)
        for x, c in enumerate(configs):
            r = row_of.get((channel, device, c))
            if r is not None and r.tokens_per_s_low is not None and r.tokens_per_s <= top:
                ax.errorbar(x, r.tokens_per_s, yerr=[[r.tokens_per_s - r.tokens_per_s_low],
                                                     [min(r.tokens_per_s_high, top) - r.tokens_per_s]],
                            fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:.0f}" if value >= 10 else f"{value:.1f}",
                        (bar.get_x() + bar.get_width() / 2, min(value, top)),
                        ha="center", va="bottom", fontsize=6)
        ax.set_ylim(0, top * 1.08)
        ax.set_xticks(range(len(configs)), configs, rotation=70, ha="right", fontsize=7)
        ax.set_title(f"{channel} / {device}", fontsize=10)
        ax.set_ylabel("verified tokens/s per request")
    for ax in list(axes.flat)[len(profiles):]:
        ax.axis("off")
    fig.suptitle("tandem bench: verified tokens/s per configuration and profile (local tokens apart, in the table)")
    written.append(save_figure(fig, out_dir / "bench_tokens_per_s.png"))
    written.append(plot_session_trace(
        out_dir / "bench_session_trace.png", trace_title, [r["t_start_s"] for r in trace],
        [r["k_asked"] for r in trace],
        [(r["t_start_s"], r["accepted"] if r["accepted"] is not None else float("nan"))
         for r in trace],
        [r["rtt_s"] * 1000.0 for r in trace], [r["server_forward_s"] * 1000.0 for r in trace],
        "of it: target pass"))
    return written
