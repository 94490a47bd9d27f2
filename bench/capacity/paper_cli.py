"""`tandem capacity --paper SURFACE.json [options]`: users per verifier on paper.

  tandem capacity --paper bench/passcost/published/h100-7b.json \
      [--inputs docs/capacity/capacity.json ...] [--calibrate-on CPU-SURFACE.json] \
      [--engine-ms PASS,JOB | --engine-from VERIFIER-BENCH.json] [--max-batch 256] \
      [--context 1024] [--validate] [--json OUT.json]

The model (bench/capacity/paper.py) runs N users, each cell's measured behaviour (tokens a round
buys, time off the verifier; from --inputs, a `tandem capacity` JSON, and the decided bench's
acceptance by k), against a verifier whose passes cost what SURFACE says, and reports per cell
and TPOT SLO the users cloud-only, each fixed k and the controller's choice (at each N the best
of those: what the adaptive controller aims at) hold at the SLOs, the users whose K/V fit the
device, and which bound binds.

The inputs were measured against the verifier of that run, so the time off the verifier is
read with that verifier's own surface (--calibrate-on, default SURFACE itself), at the level
the run's cloud-only CPU readings put its passes (a scale on the surface: this CPU is shared,
its speed comparable only within one run). Predicting that same verifier (--validate), the
model keeps that scale; another device's surface is taken as it is, with the engine's CPU work
per pass and session from --engine-ms or --engine-from (none by default). --validate compares
the predictions with the run's own measured capacities on the run's sweep grid.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path

from bench.capacity.paper import Engine, Model, Workload
from bench.capacity.paper_inputs import (cells_of, controller_for, engine_from_capacity,
                                         engine_from_verifier_bench, load_rows, options_for)
from bench.passcost.surface import Surface
from sim.writers import write_json

DEFAULT_INPUTS = [Path("docs/capacity/capacity.json"), Path("docs/capacity/lte-phone-48-64.json")]
COMMITTED_SURFACE = Path("docs/capacity/cpu-target-surface.json")  # that run's verifier's
CONTROLLER = "controller"
MEASURED = "adaptive (as run)"  # the controller calibrated on its own unloaded rows


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem capacity --paper", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("surface", type=Path, help="a pass-cost surface (tandem pass-cost's "
                                              "surface.json, or bench/passcost/published/*)")
    p.add_argument("--inputs", type=Path, action="append", default=None,
                   help="a tandem capacity JSON with the cells' unloaded rows (repeatable; "
                        "default: the committed run, docs/capacity/)")
    p.add_argument("--calibrate-on", type=Path, default=None, metavar="SURFACE.json",
                   help="the surface of the verifier the inputs were measured with (default: "
                        f"with the default inputs {COMMITTED_SURFACE}, SURFACE with --validate or "
                        "other inputs)")
    p.add_argument("--engine-ms", type=_floats, default=None, metavar="PASS,JOB",
                   help="the predicted verifier's engine CPU per pass and per session, ms "
                        "(default: as fitted for the inputs' verifier)")
    p.add_argument("--engine-from", type=Path, default=None, metavar="VERIFIER-BENCH.json",
                   help="fit the engine on a `tandem verifier-bench` run's target-only rows")
    p.add_argument("--engine-surface", type=Path, default=None, metavar="SURFACE.json",
                   help="with --engine-from: the surface of the target that run served "
                        "(default: SURFACE)")
    p.add_argument("--max-batch", type=int, default=None, help="default: configs/cloud.yaml")
    p.add_argument("--ks", type=lambda t: [int(x) for x in t.split(",")], default=[1, 2, 4, 8, 16])
    p.add_argument("--tpot-slos", type=_floats, default=[0.1, 0.05])
    p.add_argument("--ttft-slo", type=float, default=1.0)
    p.add_argument("--context", type=float, default=None,
                   help="positions per session the predicted passes and K/V see (default: the "
                        "inputs' workload, prompt + generated tokens)")
    p.add_argument("--validate", action="store_true",
                   help="predict the inputs' own measured capacities (SURFACE is theirs)")
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    surface = Surface.load(args.surface)
    calibrate = args.calibrate_on
    if calibrate is None and args.inputs is None and not args.validate:
        calibrate = COMMITTED_SURFACE  # the committed run's own verifier
    reference = Surface.load(calibrate) if calibrate else surface
    rows = load_rows(args.inputs or DEFAULT_INPUTS)
    shipped = _shipped_engine()
    workload = Workload()
    run_engine = engine_from_capacity(reference, rows, workload, shipped)
    run_model = Model(reference, run_engine, workload)
    # The run's own verifier when predicting it (--validate); another device's starts bare.
    engine = shipped if calibrate else run_engine
    engine = replace(engine, max_batch=args.max_batch or shipped.max_batch)
    if args.engine_ms:
        engine = replace(engine, pass_ms=args.engine_ms[0], job_ms=args.engine_ms[1])
    elif args.engine_from:
        served = Surface.load(args.engine_surface) if args.engine_surface else surface
        engine = engine_from_verifier_bench(served, args.engine_from, engine)
    target = replace(workload, context=args.context, kv_context=args.context)
    model = Model(surface, engine, target)
    report = {"surface": args.surface.name, "source": surface.source, "device": surface.device,
              "model": surface.model, "engine": asdict(engine),
              "inputs_engine": asdict(run_engine), "workload": asdict(target),
              "kv_users": model.kv_users(), "cells": []}
    for cell in cells_of(rows):
        options = options_for(run_model, rows, cell, args.ks, ttft_slo_s=args.ttft_slo)
        measured = controller_for(run_model, rows, cell, args.ks, ttft_slo_s=args.ttft_slo)
        report["cells"].append(_cell(model, cell, options, measured, args))
    print(_header(report))
    print(paper_table(report))
    if args.validate:
        from bench.capacity.paper_check import validate
        report["validation"] = validate(model, rows, args.tpot_slos, args.ttft_slo, args.ks)
        from bench.capacity.paper_check import validation_table
        print()
        print(validation_table(report["validation"]))
    if args.json:
        write_json(args.json, report, indent=1)
        print(f"written: {args.json}")
    return 0


def _shipped_engine() -> Engine:
    from cloud.config import CloudConfig
    from tandem.config import load_config, resolve_path

    batch = load_config(resolve_path(Path("configs/cloud.yaml")), CloudConfig).batch
    return Engine(window_ms=batch.window_ms, max_batch=batch.max_batch)


def _cell(model: Model, cell: tuple[str, str], options, measured, args) -> dict:
    """Per TPOT SLO: cloud-only, fixed k = 4, the controller's aim (the best option at each N)
    and, where the inputs have its rows, the controller as it ran (paper_inputs.controller_for)."""
    kv = model.kv_users()
    out = {"cell": "/".join(cell), "options": [asdict(o) for o in options], "slos": []}
    for slo in args.tpot_slos:
        by = {o.name: model.capacity(o, slo, args.ttft_slo) for o in options}
        best = max(options, key=lambda o: by[o.name], default=None)
        rows = []
        shown = [*((o.name, o) for o in options if o.k in (0, 4)), (CONTROLLER, best)]
        if measured is not None:
            by[MEASURED] = model.capacity(measured, slo, args.ttft_slo)
            shown.append((MEASURED, measured))
        for name, option in shown:
            if option is None:
                continue
            users = by[MEASURED if option is measured else option.name]
            rows.append(_row(model, name, option, users, kv, slo))
        out["slos"].append({"tpot_slo_s": slo, "by_option": by, "rows": rows})
    return out


def _row(model: Model, name: str, option, users: int, kv: int | None, slo: float) -> dict:
    held = users if kv is None else min(users, kv)
    if users == 0:
        binds = "the link (one user alone misses the SLO)"
    elif kv is not None and kv < users:
        binds = "KV memory"
    else:
        at = model.load(option, users)
        binds = f"passes ({at.engine_share:.0%} of a pass the engine's CPU"
        binds += ", max_batch)" if at.batch >= model.engine.max_batch - 1e-9 else ")"
    at = model.load(option, max(held, 1))
    return {"config": name, "choice": option.name, "users_by_time": users, "users_by_kv": kv,
            "users": held, "binds": binds, "batch": round(at.batch, 1),
            "pass_ms": round(at.pass_ms, 2), "tpot_p90_ms": round(at.tpot_s["p90"] * 1000, 1),
            "tau": round(option.tau, 2), "tpot_slo_s": slo}


def _header(report: dict) -> str:
    e, w = report["engine"], report["workload"]
    return (f"On paper: {report['model']} on {report['device']}\n  surface: {report['source']}\n"
            f"  engine: {e['pass_ms']:.2f} ms a pass + {e['job_ms']:.3f} ms a session, "
            f"passes at {e['surface_scale']:.3g} x the surface, "
            f"max_batch {e['max_batch']}, window {e['window_ms']} ms; workload: prompts of "
            f"{w['prompt_tokens']:.0f} tokens, {w['max_tokens']} generated, context "
            f"{w['context'] or 'prompt + half the output'}; K/V holds {report['kv_users']} users")


def paper_table(report: dict) -> str:
    lines = ["| cell | TPOT SLO | config | users (by time) | users (by KV) | users | binds | "
             "at that load: sessions/pass, pass ms, TPOT p90 ms |", "|" + "---|" * 8]
    for cell in report["cells"]:
        for slo in cell["slos"]:
            for r in slo["rows"]:
                name = r["config"] + (f" ({r['choice']})" if r["config"] == CONTROLLER else "")
                kv = "-" if r["users_by_kv"] is None else r["users_by_kv"]
                lines.append(f"| {cell['cell']} | {slo['tpot_slo_s'] * 1000:.0f} ms | {name} | "
                             f"{r['users_by_time']} | {kv} | "
                             f"{r['users']} | {r['binds']} | {r['batch']}, {r['pass_ms']}, "
                             f"{r['tpot_p90_ms']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
