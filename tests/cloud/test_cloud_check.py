"""`tandem-cloud check MODEL_DIR` reports the serving path and the self-test and exits non-zero
on a model it would serve wrongly; `tandem-cloud serve` refuses a family it cannot serve in one
line naming it. Real CLI processes on real model directories."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from family_models import build_family

from cloud import cli
from cloud.runtime import slot_attention

pytestmark = pytest.mark.e2e  # real CLI processes, real models

ROOT = Path(__file__).resolve().parents[2]
CLOUD = [sys.executable, "-m", "cloud.cli"]


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory) -> Path:
    """A softcapped, windowed family (tests/helpers/family_models.py)."""
    return build_family("gemma2", ROOT / "models/tokenizer", tmp_path_factory.mktemp("families"))


def test_check_reports_the_slot_pool_and_its_self_test(target_dir):
    run = subprocess.run([*CLOUD, "check", str(target_dir), "--device", "cpu", "--json"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["path"] == "slots" and report["exact"] and report["family"] == "llama"
    assert report["self_test"]["passed"] and report["self_test"]["argmax_agreement"] == 1.0
    assert report["kv_bytes_per_token"] > 0 and report["max_context"] > 0


def test_check_fails_on_a_model_the_slot_pool_would_serve_wrongly(gemma2_dir, monkeypatch,
                                                                   capsys):
    """With the slot attention's softcap deliberately disabled, forcing the slot pool must fail
    the check (exit 1, the self-test's difference named); auto serves it by the exact path."""
    honoured = slot_attention._features

    def without_softcap(kwargs: dict):
        kwargs.pop("softcap", None)
        return honoured(kwargs)

    monkeypatch.setattr(slot_attention, "_features", without_softcap)
    status = cli.main(["check", str(gemma2_dir), "--device", "cpu", "--serving-path", "slots"])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "refused" in out and "self-test failed" in out and "'gemma2'" in out
    assert "NOT served exactly" in out
    status = cli.main(["check", str(gemma2_dir), "--device", "cpu", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0
    assert report["path"] == "exact" and "self-test failed" in report["reason"]
    assert report["self_test"]["passed"]


def test_check_passes_the_family_when_its_features_are_honoured(gemma2_dir, capsys):
    assert cli.main(["check", str(gemma2_dir), "--device", "cpu", "--serving-path", "slots"]) == 0
    assert "slots on cpu" in capsys.readouterr().out


def test_serve_refuses_an_unknown_family_in_one_line(tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((ROOT / "models/tokenizer" / name).read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "made_up_family"}))
    run = subprocess.run([*CLOUD, "serve", "--model", str(tmp_path), "--port", "0",
                          "--log-level", "error"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "'made_up_family'" in lines[0] and "model.backend: vllm" in lines[0]
