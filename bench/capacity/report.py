"""`tandem capacity`'s output: the rows table, the capacity table with Tandem's ratios, the JSON
other tools read (`rows`, `capacity`) and the plots (per-user tokens/s p10 against N with the
SLO line; passes per token against N)."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bench.capacity.stats import Capacity, PointRow, capacity_of
from sim.writers import pyplot, save_figure
from sim.writers import write_json as write_json_file

DEFAULT = "adaptive"
BASELINES = ("cloud-only", "vllm-alone")


def capacities(rows: Sequence[PointRow], tpot_slos: Sequence[float]) -> list[Capacity]:
    groups: dict[tuple[str, str, str], list[PointRow]] = {}
    for row in rows:
        groups.setdefault((row.channel, row.device, row.config), []).append(row)
    out = []
    for (channel, device, config), mine in groups.items():
        for slo in tpot_slos:
            users = capacity_of(mine, slo)
            out.append(Capacity(channel, device, config, slo, users,
                                swept_to=max(r.users for r in mine),
                                saturated=any(r.emulator_saturated for r in mine if r.users <= max(users, 1)),
                                contended=any(r.contended for r in mine)))
    return out


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rows_table(rows: Sequence[PointRow]) -> str:
    head = ("| channel/device | config | N | req | good | TTFT p90 s | TPOT p50/p90 ms | user tok/s p10/p50 "
            "| passes/tok (user, batched) | verifier CPU ms/tok | busy | price, position cost | verified "
            "| errors | driver CPU |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        flag = (" SATURATED" if r.emulator_saturated else "") + \
            (f" CONTENDED (others {r.other_cpu_share:.0%})" if r.contended else "")
        lines.append(
            f"| {r.channel}/{r.device} | {r.config} | {r.users} | {r.requests} | {r.good_share:.2f} "
            f"[{r.good_share_low:.2f}, {r.good_share_high:.2f}] | {_f(r.ttft_p90_s)} | "
            f"{_f(_ms(r.tpot_p50_s), 0)}/{_f(_ms(r.tpot_p90_s), 0)} | "
            f"{_f(r.user_tokens_per_s_p10, 1)}/{_f(r.user_tokens_per_s_p50, 1)} | "
            f"{_f(r.passes_per_token)}, {_f(r.batched_passes_per_token, 3)} | "
            f"{_f(_ms(r.verifier_cpu_s_per_token))} | {_f(r.verifier_busy)} | "
            f"{_f(r.price)}, {_f(r.position_cost)} | {r.verified_share:.1%} | "
            f"{r.errors + r.unfinished} | {_f(r.driver_cpu_share)}{flag} |")
    return "\n".join(lines)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def capacity_table(caps: Sequence[Capacity], tpot_slos: Sequence[float]) -> str:
    """Per cell and TPOT SLO: each configuration's capacity and the default's ratios."""
    cells = list(dict.fromkeys((c.channel, c.device) for c in caps))
    configs = list(dict.fromkeys(c.config for c in caps))
    of = {(c.channel, c.device, c.config, c.tpot_slo_s): c for c in caps}
    head = "| channel/device | TPOT SLO | " + " | ".join(configs) + " | " + \
        " | ".join(f"{DEFAULT} / {b}" for b in BASELINES) + " |"
    lines = [head, "|" + "---|" * (2 + len(configs) + len(BASELINES))]
    for channel, device in cells:
        for slo in tpot_slos:
            def cap(config: str) -> str:
                c = of.get((channel, device, config, slo))
                if c is None:
                    return "-"
                more = "+" if c.users == c.swept_to else ""   # met at the largest N asked
                return f"{c.users}{more}{' (sat)' if c.saturated else ''}{' (cont)' if c.contended else ''}"

            ratios = []
            mine = of.get((channel, device, DEFAULT, slo))
            for base in BASELINES:
                other = of.get((channel, device, base, slo))
                ratios.append("-" if mine is None or other is None or other.users == 0
                              else f"{mine.users / other.users:.2f}")
            lines.append(f"| {channel}/{device} | {slo * 1000:.0f} ms | "
                         + " | ".join(cap(c) for c in configs) + " | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def write_json(path: Path, rows: Sequence[PointRow], caps: Sequence[Capacity], meta: dict) -> None:
    write_json_file(path, {**meta, "rows": [asdict(r) for r in rows],
                           "capacity": [asdict(c) for c in caps]}, indent=1)


def write_plots(out_dir: Path, rows: Sequence[PointRow], slo_tpot_s: float) -> list[Path]:
    plt = pyplot()
    cells = list(dict.fromkeys((r.channel, r.device) for r in rows))
    configs = list(dict.fromkeys(r.config for r in rows))
    fig, axes = plt.subplots(2, len(cells), figsize=(5.5 * len(cells), 7.5), squeeze=False)
    for col, (channel, device) in enumerate(cells):
        speed_ax, passes_ax = axes[0][col], axes[1][col]
        for config in configs:
            mine = sorted((r for r in rows if (r.channel, r.device, r.config) == (channel, device, config)),
                          key=lambda r: r.users)
            if not mine:
                continue
            users = [r.users for r in mine]
            style = dict(marker="o", label=config, linewidth=2.4 if config == DEFAULT else 1.4)
            speed_ax.plot(users, [r.user_tokens_per_s_p10 or 0.0 for r in mine], **style)
            passes = [r.passes_per_token for r in mine]
            passes_ax.plot(users, [p if p is not None else math.nan for p in passes], **style)
        speed_ax.axhline(1.0 / slo_tpot_s, color="red", linestyle="--", linewidth=1,
                         label=f"SLO: TPOT {slo_tpot_s * 1000:.0f} ms")
        speed_ax.set(title=f"{channel} / {device}", xscale="log", yscale="log",
                     xlabel="concurrent users N", ylabel="per-user tokens/s, p10")
        passes_ax.set(xscale="log", xlabel="concurrent users N",
                      ylabel="target passes per token (the users' rounds)")
        speed_ax.grid(True, which="both", alpha=0.3)
        passes_ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Users served by one verifier on one core (this machine's CPU)")
    return [save_figure(fig, out_dir / "capacity.png")]


def summary_table(rows: Sequence[PointRow], caps: Sequence[Capacity], slo_tpot_s: float) -> str:
    """Per cell and configuration: capacity at each SLO, and at N = 1 and at capacity the passes
    per token and per-user speed; errors and verified share over the points up to capacity."""
    lines = ["| channel/device | config | capacity (TPOT SLOs) | passes/tok N=1 -> cap | user tok/s p50 "
             "N=1 -> cap | verifier busy at cap | errors <= cap | verified <= cap |",
             "|" + "---|" * 8]
    by_cell: dict[tuple[str, str, str], list[PointRow]] = {}
    for row in rows:
        by_cell.setdefault((row.channel, row.device, row.config), []).append(row)
    for (channel, device, config), mine in by_cell.items():
        mine.sort(key=lambda r: r.users)
        own = [c for c in caps if (c.channel, c.device, c.config) == (channel, device, config)]
        main = next((c.users for c in own if c.tpot_slo_s == slo_tpot_s), 0)
        first = mine[0]
        at = next((r for r in mine if r.users == main), None)
        upto = [r for r in mine if r.users <= main]  # none when even the first point missed

        def passes(r: PointRow | None) -> str:
            return "-" if r is None else _f(r.batched_passes_per_token if config == "vllm-alone"
                                             and r.batched_passes_per_token is not None else r.passes_per_token)

        lines.append(
            f"| {channel}/{device} | {config} | "
            + ", ".join(f"{c.users} @ {c.tpot_slo_s * 1000:.0f} ms" for c in own)
            + f" | {passes(first)} -> {passes(at)} | {_f(first.user_tokens_per_s_p50, 1)} -> "
            f"{_f(at.user_tokens_per_s_p50 if at else None, 1)} | {_f(at.verifier_busy if at else None)} | "
            f"{sum(r.errors + r.unfinished for r in upto)} | "
            f"{f'{min(r.verified_share for r in upto):.1%}' if upto else '-'} |")
    return "\n".join(lines)


def cost_table(rows: Sequence[PointRow], baseline: str = "cloud-only") -> str:
    """Per point: what a committed token cost the verifier, as its CPU counter says (the whole
    process) and as it measured it per mode (cloud/token_cost.py: its passes and, on one CPU
    thread, each reply's serving), and the CPU per token against the baseline's at the same N in
    the same cell."""
    lines = ["| channel/device | config | N | verifier CPU ms/tok | / " + baseline + " | measured "
             "ms/tok (both modes) | speculate ms/tok | cloud ms/tok | speculated share |",
             "|" + "---|" * 9]
    base = {(r.channel, r.device, r.users): r.verifier_cpu_s_per_token
            for r in rows if r.config == baseline}
    for r in rows:
        if r.verifier_cpu_s_per_token is None:
            continue  # vLLM alone: no verifier readings
        other = base.get((r.channel, r.device, r.users))
        ratio = r.verifier_cpu_s_per_token / other if other else None
        lines.append(f"| {r.channel}/{r.device} | {r.config} | {r.users} | "
                     f"{_f(_ms(r.verifier_cpu_s_per_token))} | {_f(ratio)} | "
                     f"{_f(r.measured_token_ms)} | {_f(r.speculate_token_ms)} | "
                     f"{_f(r.cloud_token_ms)} | {_f(r.speculated_share)} |")
    return "\n".join(lines)


def rows_from_samples(path: Path, slo_ttft_s: float, tpot_slos: Sequence[float]) -> list[PointRow]:
    """Rows rebuilt from a --samples file (a run that stopped keeps its requests): the server's
    readings (passes, CPU) are not in it, and the window is the span of the requests' starts."""
    from bench.capacity.stats import ServerReading, point_row
    from bench.capacity.users import Sample

    groups: dict[tuple, list[Sample]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            key = tuple(record.pop(k) for k in ("channel", "device", "config", "users"))
            groups.setdefault(key, []).append(Sample(**record))
    rows = []
    for (channel, device, config, users), samples in groups.items():
        starts = [s.started for s in samples]
        reading = ServerReading(window_s=max(starts) - min(starts) if len(starts) > 1 else 0.0,
                                window_tokens=sum(s.tokens for s in samples))
        rows.append(point_row(channel, device, config, users, samples, reading, slo_ttft_s,
                              tpot_slos[0], tpot_slos[1:]))
    return rows


def main(argv: list[str] | None = None) -> int:
    """python -m bench.capacity.report PATH.json | PATH.jsonl: the tables of an earlier run,
    from its JSON, or from its --samples file (without the server's readings)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("path", type=Path)
    parser.add_argument("--slo-ttft-s", type=float, default=1.0, help="for a --samples file")
    parser.add_argument("--tpot-slos", type=float, nargs="+", default=[0.1, 0.05],
                        help="for a --samples file: the main TPOT SLO first")
    args = parser.parse_args(argv)
    if args.path.suffix == ".jsonl":
        slos = args.tpot_slos
        rows = rows_from_samples(args.path, args.slo_ttft_s, slos)
    else:
        data = json.loads(args.path.read_text())
        fields_of_row = set(PointRow.__dataclass_fields__)
        rows = [PointRow(**{k: v for k, v in r.items() if k in fields_of_row}) for r in data["rows"]]
        slos = data["slo"]["tpot_s"]
    caps = capacities(rows, slos)
    print(rows_table(rows), "\n")
    print(capacity_table(caps, slos), "\n")
    print(summary_table(rows, caps, slos[0]), "\n")
    print(cost_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
