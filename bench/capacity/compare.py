"""Two `tandem capacity --samples` files side by side: per (channel, device, config, users), the
mean TTFT, TPOT, per-request tokens/s and target passes per token of each, with 95% bootstrap
intervals over requests, and whether the intervals overlap. Made for the replay check (replay
draft vs `--live-draft` at small N), usable for any two runs.

    python -m bench.capacity.compare out/replay.jsonl out/live.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from tandem import metrics

RESAMPLES = 2000

Metric = Callable[[dict], float | None]
METRICS: dict[str, Metric] = {
    "TTFT ms": lambda s: None if s["ttft_s"] is None else 1000.0 * s["ttft_s"],
    "TPOT ms": lambda s: None if s["ttft_s"] is None or s["tokens"] < 2
    else 1000.0 * metrics.tpot(s["wall_s"], s["ttft_s"], s["tokens"]),
    "tok/s": lambda s: s["tokens"] / s["wall_s"] if s["wall_s"] > 0 else None,
    "passes/tok": lambda s: s["target_passes"] / s["tokens"] if s["tokens"] else None,
}


def read(path: Path) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            s = json.loads(line)
            if s["error"] is None and s["finished"]:
                groups.setdefault((s["channel"], s["device"], s["config"], s["users"]), []).append(s)
    return groups


def mean_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95% bootstrap interval."""
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(RESAMPLES))
    return sum(values) / n, means[int(0.025 * RESAMPLES)], means[int(0.975 * RESAMPLES) - 1]


def compare(a: dict[tuple, list[dict]], b: dict[tuple, list[dict]], names: tuple[str, str]) -> tuple[str, int, int]:
    """The table, how many (point, metric) pairs were compared, and how many overlapped."""
    lines = [f"| point | metric | {names[0]} mean [95%] | {names[1]} mean [95%] | overlap |",
             "|---|---|---|---|---|"]
    compared = overlapping = 0
    for key in sorted(set(a) & set(b)):
        for label, metric in METRICS.items():
            xs = [v for s in a[key] if (v := metric(s)) is not None]
            ys = [v for s in b[key] if (v := metric(s)) is not None]
            if len(xs) < 2 or len(ys) < 2:
                continue
            (ma, la, ha), (mb, lb, hb) = mean_interval(xs), mean_interval(ys)
            overlap = la <= hb and lb <= ha
            compared += 1
            overlapping += overlap
            lines.append(f"| {'/'.join(map(str, key))} | {label} | {ma:.2f} [{la:.2f}, {ha:.2f}] "
                         f"(n={len(xs)}) | {mb:.2f} [{lb:.2f}, {hb:.2f}] (n={len(ys)}) | "
                         f"{'yes' if overlap else 'NO'} |")
    return "\n".join(lines), compared, overlapping


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    args = parser.parse_args(argv)
    table, compared, overlapping = compare(read(args.first), read(args.second),
                                           (args.first.stem, args.second.stem))
    print(table)
    print(f"\n{overlapping} of {compared} (point, metric) intervals overlap")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
