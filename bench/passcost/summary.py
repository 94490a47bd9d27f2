"""scripts/gpu-check.sh's one summary table, from what its steps wrote to the output folder:

  python -m bench.passcost.summary OUT_DIR     (writes OUT_DIR/summary.md and prints it)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.passcost.surface import Surface

SHOWN = ((1, 1), (64, 1), (64, 5), (256, 1), (256, 5))   # (sessions, tokens each) per surface


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps_lines(out: Path) -> list[str]:
    lines = ["| step | exit | seconds (cap) |", "|---|---:|---:|"]
    table = out / "steps.tsv"
    for row in (table.read_text().splitlines() if table.exists() else []):
        name, rc, secs, cap = row.split("\t")
        verdict = {"0": "0", "124": "124 (time cap)", "137": "137 (killed)"}.get(rc, rc)
        lines.append(f"| {name} | {verdict} | {secs} ({cap}) |")
    return lines


def surface_lines(out: Path) -> list[str]:
    lines = ["| surface | device, dtype | context | " + " | ".join(
        f"B={b} n={n} ms" for b, n in SHOWN) + " | position cost at B=64 | KV B/token | "
        "sessions in K/V at 1024 |", "|" + "---|" * (len(SHOWN) + 6)]
    for path in sorted(out.glob("surface-*/surface.json")):
        s = Surface.load(path)
        if not s.points:
            continue
        batches, _, contexts = s.grid()
        context = contexts[-1]
        cells = [f"{s.pass_ms(b, n, context):.2f}" if b <= batches[-1] else "-" for b, n in SHOWN]
        lines.append(f"| {s.model} | {s.device}, {s.dtype} | {context} | " + " | ".join(cells)
                     + f" | {s.position_cost(min(64, batches[-1]), context):.3f} | "
                     f"{s.kv_bytes_per_token} | {s.kv_sessions(1024)} |")
    return lines


def verifier_lines(data: dict | None) -> list[str]:
    if not data:
        return ["(no verifier-bench result)"]
    by = {(r["backend"], r["sessions"]): r for r in data["rows"]}
    lines = ["| sessions | verifier tok/s (round p50 ms) | same engine decoding alone tok/s "
             "(p50 ms) | ratio |", "|---:|---:|---:|---:|"]
    for n in sorted({s for _, s in by}):
        spec, alone = by.get(("torch", n)), by.get(("torch-ar", n))
        if spec is None or alone is None:
            continue
        lines.append(f"| {n} | {spec['goodput_tok_s']:.0f} ({spec['round_ms_p50']:.1f}) | "
                     f"{alone['goodput_tok_s']:.0f} ({alone['round_ms_p50']:.1f}) | "
                     f"{spec['goodput_tok_s'] / alone['goodput_tok_s']:.2f} |")
    return lines


def capacity_lines(data: dict | None) -> list[str]:
    if not data:
        return ["(no capacity result)"]
    lines = ["| cell | config | TPOT SLO | users |", "|---|---|---:|---:|"]
    for c in data["capacity"]:
        lines.append(f"| {c['channel']}/{c['device']} | {c['config']} | "
                     f"{c['tpot_slo_s'] * 1000:.0f} ms | {c['users']} (swept to {c['swept_to']}) |")
    return lines


def paper_lines(out: Path) -> list[str]:
    lines = ["| surface | cell | TPOT SLO | config | users | binds |",
             "|---|---|---:|---|---:|---|"]
    for path in sorted(out.glob("paper-*.json")):
        data = _json(path)
        for cell in (data or {}).get("cells", []):
            for slo in cell["slos"]:
                for r in slo["rows"]:
                    name = r["config"]
                    if name == "controller":
                        name += f" ({r['choice']})"
                    lines.append(f"| {path.stem[6:]} | {cell['cell']} | "
                                 f"{slo['tpot_slo_s'] * 1000:.0f} ms | {name} | {r['users']} | "
                                 f"{r['binds']} |")
    return lines


def summary(out: Path) -> str:
    identity = _json(out / "identity.json")
    parts = ["# GPU check summary", "", *steps_lines(out), "", "## Greedy identity", "",
             "(none)" if identity is None else
             f"{identity['identical']}/{identity['prompts']} held-out prompts x "
             f"{identity['tokens']} tokens identical on {identity['device']} ({identity['dtype']})",
             "", "## Pass-cost surfaces", "", *surface_lines(out), "",
             "## verifier-bench", "", *verifier_lines(_json(out / "verifier-bench.json")), "",
             "## tandem capacity (verifier on the device)", "",
             *capacity_lines(_json(out / "capacity" / "capacity.json")), "",
             "## Users per verifier on paper (estimates)", "", *paper_lines(out)]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    out = Path((argv if argv is not None else sys.argv[1:])[0])
    text = summary(out)
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
