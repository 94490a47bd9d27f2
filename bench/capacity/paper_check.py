"""The on-paper model against a measured capacity run: fed the surface of the run's own
verifier, does it predict the capacities the run measured?

Predictions are read the way the sweep reads a run: at each user count the run measured for that
configuration, in order, the last one the model says meets the SLOs before the first it says
misses. "Within one sweep step": the predicted and the measured capacity are the same or
neighbouring counts of that sweep (0 below its first).
"""
from __future__ import annotations

from bench.capacity.paper import Model
from bench.capacity.paper_inputs import cells_of, controller_for, options_for
from bench.capacity.stats import PointRow, capacity_of

CHECKED = ("cloud-only", "fixed-k4", "adaptive")


def measured_capacity(rows: list[dict], cell: tuple[str, str], config: str, slo: float) -> int:
    fields = set(PointRow.__dataclass_fields__)
    mine = [PointRow(**{k: v for k, v in r.items() if k in fields}) for r in rows
            if (r["channel"], r["device"], r["config"]) == (*cell, config)]
    return capacity_of(mine, slo)


def validate(model: Model, rows: list[dict], slos: list[float], ttft_slo: float,
             ks: list[int]) -> list[dict]:
    out = []
    for cell in cells_of(rows):
        options = options_for(model, rows, cell, ks, ttft_slo_s=ttft_slo)
        by_name = {o.name: o for o in options}
        controller = controller_for(model, rows, cell, ks, ttft_slo_s=ttft_slo)
        if controller is not None:
            by_name["adaptive"] = controller
        for config in CHECKED:
            counts = sorted({r["users"] for r in rows
                             if (r["channel"], r["device"], r["config"]) == (*cell, config)})
            if not counts or config not in by_name and config != "adaptive":
                continue
            # the controller as measured; without its rows, its aim: the best option at each N
            chosen = [by_name[config]] if config in by_name else options
            for slo in slos:
                def meets(users: int) -> bool:
                    return any(model.meets(o, users, slo, ttft_slo) for o in chosen)

                predicted = 0
                for users in counts:
                    if not meets(users):
                        break
                    predicted = users
                measured = measured_capacity(rows, cell, config, slo)
                raw = max(model.capacity(o, slo, ttft_slo) for o in chosen)
                grid = [0, *counts]
                steps = abs(grid.index(predicted) - grid.index(measured))
                out.append({"cell": "/".join(cell), "config": config, "tpot_slo_s": slo,
                            "measured": measured, "predicted": predicted, "predicted_raw": raw,
                            "sweep": counts, "steps": steps, "within_one_step": steps <= 1})
    return out


def validation_table(results: list[dict]) -> str:
    lines = ["| cell | TPOT SLO | config | measured | predicted on the run's grid (raw) | "
             "sweep steps apart | within one step |", "|" + "---|" * 7]
    for r in results:
        lines.append(f"| {r['cell']} | {r['tpot_slo_s'] * 1000:.0f} ms | {r['config']} | "
                     f"{r['measured']} | {r['predicted']} ({r['predicted_raw']}) | {r['steps']} | "
                     f"{'yes' if r['within_one_step'] else 'NO'} |")
    held = sum(r["within_one_step"] for r in results)
    lines.append(f"\nwithin one sweep step: {held} of {len(results)}")
    return "\n".join(lines)
