"""The pass-cost surface's reading (bench/passcost/surface.py) and the on-paper users-per-verifier
model (bench/capacity/paper.py): interpolation, the published curve, the model's closed-loop
arithmetic at its limits, its calibration on unloaded rows, and the KV bound."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.capacity.paper import Engine, Model, UserMode, Workload
from bench.capacity.paper_inputs import options_for
from bench.passcost.surface import PassPoint, Surface

pytestmark = pytest.mark.unit

FIXED, PER_SESSION, PER_POSITION = 4.0, 0.3, 0.1   # ms: a synthetic device


def _affine(kv_room: int | None = None) -> Surface:
    """A measured-looking grid of an affine device: a + b B + c B n ms."""
    points = [PassPoint(b, n, ctx, FIXED + PER_SESSION * b + PER_POSITION * b * n, 0, 0, 1)
              for b in (1, 2, 4, 8, 16, 32, 64) for n in (1, 2, 4, 8) for ctx in (64, 256)]
    return Surface("synthetic", "test", "affine", "float32", 1000, kv_room, points)


def test_the_surface_reads_its_points_and_what_lies_between_and_beyond():
    s = _affine()
    assert s.pass_ms(8, 4, 64) == pytest.approx(4.0 + 2.4 + 3.2)
    assert s.pass_ms(12, 3, 160) == pytest.approx(4.0 + 3.6 + 3.6)        # between
    assert s.pass_ms(128, 1, 256) == pytest.approx(4.0 + 38.4 + 12.8)     # past the largest B
    assert s.pass_ms(1, 60, 64) == pytest.approx(4.0 + 0.3 + 6.0)         # a prompt's pass
    assert s.position_ms(16, 64) == pytest.approx(PER_POSITION)
    step = (FIXED + (PER_SESSION + PER_POSITION) * 16) / 16
    assert s.position_cost(16, 64) == pytest.approx(PER_POSITION / step)


def test_a_noisy_surface_never_reads_a_bigger_pass_cheaper():
    """A smoke surface whose batch 2 read faster than batch 1 (16.1 then 13.2 ms: noise on a
    shared core) read 0 ms at batch 64 and divided by it in the model; past the grid a pass
    now costs at least the largest measured one, and the model holds users."""
    points = [PassPoint(1, 1, 32, 16.1, 0, 0, 1), PassPoint(1, 3, 32, 16.6, 0, 0, 1),
              PassPoint(2, 1, 32, 13.2, 0, 0, 1), PassPoint(2, 3, 32, 12.0, 0, 0, 1)]
    s = Surface("smoke", "cpu", "tandem-target", "float32", 8192, None, points)
    assert s.pass_ms(64, 1, 32) == pytest.approx(13.2)
    assert s.pass_ms(64, 6, 32) >= 12.0
    model = Model(s, Engine(max_batch=64), Workload())
    cloud = UserMode("cloud-only", 0, 1.0, {"p50": 0.0, "p90": 0.002})
    assert model.capacity(cloud, 0.1, 1.0) >= 1


def test_a_published_curve_adds_the_kv_its_sessions_read():
    s = Surface("published", "H100", "7b", "bfloat16", 131072, None,
                total_tokens=[[1, 5.7], [128, 5.7], [256, 9.3]], kv_read_gb_s=2000.0)
    assert s.pass_ms(64, 2, 0) == pytest.approx(5.7)
    assert s.pass_ms(64, 3, 0) == pytest.approx(5.7 + 3.6 * 64 / 128)
    assert s.pass_ms(64, 2, 1000) == pytest.approx(5.7 + 64 * 1000 * 131072 / 2e9)


def test_cloud_runs_put_every_user_in_every_pass():
    model = Model(_affine(), Engine(max_batch=64), Workload(prompt_tokens=1, max_tokens=10**9))
    cloud = UserMode("cloud-only", 0, 1.0, {"p50": 0.0, "p90": 0.002})
    load = model.load(cloud, 32)
    assert load.batch == 32
    assert load.tpot_s["p50"] == pytest.approx(model.pass_ms(32, 1) / 1000, rel=1e-3)
    assert load.tpot_s["p90"] == pytest.approx(load.tpot_s["p50"] + 0.002, rel=1e-3)
    # past max_batch every user waits its turn: N / max_batch passes a token
    assert model.load(cloud, 128).tpot_s["p50"] == pytest.approx(
        2 * model.pass_ms(64, 1) / 1000, rel=1e-2)


def test_one_user_drafting_costs_its_drafting_its_link_and_one_pass():
    engine = Engine(pass_ms=1.0, job_ms=0.5, window_ms=2.0, max_batch=64)
    model = Model(_affine(), engine, Workload(prompt_tokens=1, max_tokens=10**9))
    k4 = UserMode("fixed-k4", 4, 3.0, {"p50": 0.05, "p90": 0.08})
    one = model.load(k4, 1)
    pass_ms = FIXED + PER_SESSION + PER_POSITION * 5 + 1.5
    assert one.pass_ms == pytest.approx(pass_ms, rel=1e-6)
    assert one.busy < 0.2
    assert one.tpot_s["p50"] * 1000 == pytest.approx((50 + 2 + pass_ms) / 3, rel=0.05)
    tpots = [model.load(k4, n).tpot_s["p90"] for n in (1, 4, 16, 64, 256)]
    assert tpots == sorted(tpots)
    cap = model.capacity(k4, 0.1)
    assert model.meets(k4, cap, 0.1, 1.0) and not model.meets(k4, cap + 1, 0.1, 1.0)


def test_the_kv_bound_and_a_link_that_misses_alone():
    model = Model(_affine(kv_room=1000 * 100 * 20), Engine(), Workload(60, 40))
    assert model.kv_users() == 20
    slow = UserMode("fixed-k4", 4, 2.0, {"p50": 0.3, "p90": 0.4})
    assert model.capacity(slow, 0.1) == 0


def test_calibration_reproduces_the_unloaded_rows():
    """z is read off a cell's lightly loaded rows, so the model gives back their TPOT p50 and p90."""
    model = Model(_affine(), Engine(pass_ms=1.0, job_ms=0.2), Workload())
    rows = [dict(channel="lte", device="phone", config="cloud-only", users=1, tpot_p50_s=0.008,
                 tpot_p90_s=0.011, ttft_p90_s=0.3, passes_per_token=1.0),
            dict(channel="lte", device="phone", config="fixed-k4", users=1, tpot_p50_s=0.06,
                 tpot_p90_s=0.085, ttft_p90_s=0.4, passes_per_token=0.3)]
    known = {"tau_by_k": {"1": 1.75, "4": 2.94, "8": 3.67}, "draft_tok_s": {"phone": 40.0}}
    options = {o.name: o for o in options_for(model, rows, ("lte", "phone"), [1, 4, 8], known)}
    for name, row in (("cloud-only", rows[0]), ("fixed-k4", rows[1])):
        load = model.load(options[name], 1)
        assert load.tpot_s["p50"] == pytest.approx(row["tpot_p50_s"], rel=1e-3)
        assert load.tpot_s["p90"] == pytest.approx(row["tpot_p90_s"], rel=1e-3)
        assert load.ttft_p90_s == pytest.approx(row["ttft_p90_s"], rel=1e-3)
    k4, k8 = options["fixed-k4"], options["fixed-k8"]
    assert k4.tau == pytest.approx(1 / 0.3)
    assert k8.z_s["p50"] == pytest.approx(k4.z_s["p50"] + 4 / 40.0)
    assert k8.tau == pytest.approx(1 + (3.67 - 1) * (1 / 0.3 - 1) / (2.94 - 1))


def test_the_engine_is_what_verifier_bench_rounds_take_beyond_the_pass(tmp_path):
    """verifier-bench's target-only rows (every session in every pass): round p50 less the
    surface's pass at that B is the engine, here 3 ms a pass and 0.25 ms a session."""
    import json

    from bench.capacity.paper_inputs import engine_from_verifier_bench

    surface = _affine()
    rows = [{"backend": "torch-ar", "sessions": b,
             "round_ms_p50": surface.pass_ms(b, 1, 280) + 3.0 + 0.25 * b} for b in (1, 16, 64)]
    rows.append({"backend": "torch", "sessions": 64, "round_ms_p50": 1000.0})
    path = tmp_path / "vb.json"
    path.write_text(json.dumps({"rows": rows}))
    engine = engine_from_verifier_bench(surface, path, Engine())
    assert engine.pass_ms == pytest.approx(3.0) and engine.job_ms == pytest.approx(0.25)


def test_requests_a_links_fades_fail_alone_are_failed_at_every_load():
    """Light rows whose good share (0.9) lies below what their TPOT and TTFT bodies give (~0.98)
    say the link fails some requests at any load (UserMode.fades): the model then holds fewer
    users than by the bodies alone, and a good share is the product of both SLOs' shares."""
    model = Model(_affine(), Engine(pass_ms=1.0, job_ms=0.2), Workload())
    row = dict(channel="lte", device="phone", config="fixed-k4", users=1, tpot_p50_s=0.066,
               tpot_p90_s=0.085, ttft_p50_s=0.35, ttft_p90_s=0.43, passes_per_token=0.3,
               good_share_by_tpot={"0.1": 0.9}, requests=40)
    k4 = options_for(model, [row], ("lte", "phone"), [4], {"tau_by_k": {"4": 2.94},
                                                           "draft_tok_s": {"phone": 40.0}})[0]
    body = model.good_share(k4, 1, 0.1, 1.0, fades=False)
    assert 0.95 < body < 1.0
    assert k4.fades["0.1"] == pytest.approx(1 - 0.9 / body)
    assert model.good_share(k4, 1, 0.1, 1.0) == pytest.approx(0.9, rel=1e-6)
    bodies_alone = replace(k4, fades={})
    assert model.capacity(k4, 0.1) < model.capacity(bodies_alone, 0.1)
    assert model.good_share(bodies_alone, 64, 0.1, 0.5) < model.good_share(bodies_alone, 64, 0.1, 1.0)


@pytest.mark.parametrize("inputs, cells", [
    ([], 12),   # the committed run (docs/capacity/capacity.json and its 48-64 lte/phone points)
    (["--inputs", "docs/capacity/wifi-laptop-2026-12-07.json"], 6),  # a fresh wifi/laptop sweep
])
def test_fed_the_cpus_surface_it_predicts_the_runs_capacities(tmp_path, monkeypatch, inputs,
                                                              cells):
    """`tandem capacity --paper --validate` with the CPU's committed surface: cloud-only,
    fixed-k4 and the adaptive controller (calibrated on its own unloaded rows, as the others)
    within one sweep step of the measured capacities in every cell at both TPOT SLOs. With
    the spread of the additive model (z quantiles) fixed-k4 and adaptive read 128 where 64 was
    measured on wifi/laptop at 100 ms."""
    from bench.capacity.paper_cli import main

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the committed inputs' paths
    out = tmp_path / "paper.json"
    assert main(["docs/capacity/cpu-target-surface.json", "--validate", *inputs,
                 "--json", str(out)]) == 0
    results = json.loads(out.read_text())["validation"]
    assert len(results) == cells
    assert all(r["within_one_step"] for r in results), \
        [(r["cell"], r["config"], r["tpot_slo_s"], r["measured"], r["predicted"]) for r in results]


def test_a_speculating_users_spread_scales_with_its_tpot():
    """Speculation's TPOT p90 / p50 is its prompts' spread of tokens a round, the same at any
    load (UserMode.spread); a cloud run's p90 is its p50 plus the link's jitter."""
    model = Model(_affine(), Engine(max_batch=64), Workload(prompt_tokens=1, max_tokens=10**9))
    k4 = UserMode("fixed-k4", 4, 3.0, {"p50": 0.05}, spread={"p90": 1.4})
    for users in (1, 16, 64):
        load = model.load(k4, users)
        assert load.tpot_s["p90"] == pytest.approx(1.4 * load.tpot_s["p50"])
    assert model.load(k4, 64).tpot_s["p50"] > model.load(k4, 1).tpot_s["p50"]
