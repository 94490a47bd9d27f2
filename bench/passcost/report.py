"""`tandem pass-cost`'s table and plot."""
from __future__ import annotations

from pathlib import Path

from bench.passcost.surface import Surface
from sim.writers import pyplot, save_figure

def surface_table(surface: Surface) -> str:
    batches, tokens, contexts = surface.grid()
    lines = [f"{surface.model} on {surface.device} ({surface.dtype}, served by the "
             f"{surface.serving_path or 'slots'} path); {surface.source}"]
    for context in contexts:
        lines += ["", f"context {context}: pass ms (median [min, max]) by tokens per session; "
                      f"step = the 1-token pass / B; c = what a fed position adds; position "
                      f"cost = c / step",
                  "| B | " + " | ".join(f"n={n}" for n in tokens)
                  + " | step ms | c ms | position cost |",
                  "|" + "---:|" * (len(tokens) + 4)]
        for batch in batches:
            at = {p.tokens: p for p in surface.points if (p.batch, p.context) == (batch, context)}
            if not at:
                continue
            cells = [f"{at[n].ms:.2f} [{at[n].ms_min:.2f}, {at[n].ms_max:.2f}]" if n in at
                     else "-" for n in tokens]
            lines.append(f"| {batch} | " + " | ".join(cells) +
                         f" | {surface.step_ms(batch, context):.3f} | "
                         f"{surface.position_ms(batch, context):.4f} | "
                         f"{surface.position_cost(batch, context):.3f} |")
    lines += ["", f"KV bytes per token: {surface.kv_bytes_per_token}; memory for K/V "
                  f"(free after loading, less a reserve): "
                  + ("unknown" if surface.kv_room_bytes is None
                     else f"{surface.kv_room_bytes / 2**30:.1f} GiB")]
    for context in sorted({*contexts, 4096}):
        held = surface.kv_sessions(context)
        if held is not None:
            lines.append(f"  context {context}: K/V for {held} sessions")
    lines += [f"note: {n}" for n in surface.notes]
    lines += [f"skipped: {s}" for s in surface.skipped]
    return "\n".join(lines)


def write_plot(surface: Surface, path: Path) -> Path:
    """Per context: pass ms against B (one line per tokens per session), and the position cost
    (c / step) against B."""
    plt = pyplot()
    batches, tokens, contexts = surface.grid()
    fig, axes = plt.subplots(2, len(contexts), figsize=(5.5 * len(contexts), 7.5), squeeze=False)
    for col, context in enumerate(contexts):
        time_ax, cost_ax = axes[0][col], axes[1][col]
        for n in tokens:
            mine = sorted((p for p in surface.points if (p.tokens, p.context) == (n, context)),
                          key=lambda p: p.batch)
            if mine:
                time_ax.errorbar([p.batch for p in mine], [p.ms for p in mine],
                                 yerr=[[p.ms - p.ms_min for p in mine],
                                       [p.ms_max - p.ms for p in mine]],
                                 marker="o", capsize=2, label=f"{n} token(s)/session")
        have = [b for b in batches if any((p.batch, p.context) == (b, context)
                                          for p in surface.points)]
        cost_ax.plot(have, [surface.position_cost(b, context) for b in have], marker="o")
        time_ax.set(title=f"{surface.model}, context {context}", xscale="log", yscale="log",
                    xlabel="sessions in the pass B", ylabel="pass ms (median, min-max)")
        cost_ax.set(xscale="log", xlabel="sessions in the pass B",
                    ylabel="position cost c / step (1-token sessions)")
        time_ax.grid(True, which="both", alpha=0.3)
        cost_ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Verify pass cost: {surface.model} on {surface.device} ({surface.dtype})")
    return save_figure(fig, path, dpi=100)
