"""`--set KEY=VALUE` always wins over a named flag the user did not give, in every CLI that takes
--set (tandem/config.py command_line is the one place they combine): tandem-cloud serve,
tandem-edge serve / generate, tandem sim and tandem bench, each with a key that also has a named
flag. A flag that is given still wins over --set. (tandem capacity's --cloud-set reaches the
verifier's command line: tests/tandem/test_set_options_e2e.py, with the processes themselves.)"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from bench.cli import build_parser as bench_parser
from sim.cli import build_parser, sim_config
from bench.matrix.cli import bench_config
from cloud.cli import load_cloud_config
from edge.cli import load_edge_config
from tandem.config import command_line

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
DRAFT = ROOT / "models/tandem-draft"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("TANDEM_CLOUD_", "TANDEM_EDGE_", "TANDEM_SIM_", "TANDEM_BENCH_")):
            monkeypatch.delenv(name)


def test_an_unset_flag_overrides_nothing_and_a_given_one_wins():
    assert command_line(["server.port=5", "model.path=d"],
                        {"server": {"port": None, "host": None}, "model": {"path": None}}) \
        == {"server": {"port": 5}, "model": {"path": "d"}}
    assert command_line(["server.port=5"], {"server": {"port": 6}}) == {"server": {"port": 6}}


def cloud_args(*sets: str, **flags) -> argparse.Namespace:
    """tandem-cloud serve's arguments as its parser leaves them (unset flags are None)."""
    names = ("host", "port", "metrics_port", "model", "device", "dtype")
    return argparse.Namespace(config=ROOT / "configs/cloud.yaml", set=list(sets),
                              **{name: flags.get(name) for name in names})


def test_cloud_serve_set_reaches_keys_that_have_flags():
    config = load_cloud_config(cloud_args("server.port=50999", f"model.path={DRAFT}",
                                          "model.device=cpu", "model.dtype=bfloat16",
                                          "server.host=127.0.0.2", "server.metrics_port=9999"))
    assert (config.server.port, config.server.host, config.server.metrics_port) == \
        (50999, "127.0.0.2", 9999)
    assert (str(config.model.path), config.model.device, config.model.dtype) == \
        (str(DRAFT), "cpu", "bfloat16")
    flagged = load_cloud_config(cloud_args("server.port=50999", port=51000))
    assert flagged.server.port == 51000


def edge_args(*sets: str, **flags) -> argparse.Namespace:
    """tandem-edge serve's arguments as its parser leaves them (unset flags are None)."""
    names = ("cloud", "api_key", "backend", "draft_model", "tokenizer_dir", "host", "port",
             "log_level")
    return argparse.Namespace(config=Path("configs/edge.yaml"), set=list(sets),
                              **{name: flags.get(name) for name in names})


def test_edge_set_reaches_keys_that_have_flags():
    config = load_edge_config(edge_args("daemon.port=8999", "daemon.host=127.0.0.2",
                                        "cloud.address=127.0.0.1:1", "daemon.log_level=debug",
                                        "cloud.api_key=k", f"draft.tokenizer_dir={DRAFT}"))
    assert (config.daemon.port, config.daemon.host, config.daemon.log_level) == \
        (8999, "127.0.0.2", "debug")
    assert (config.cloud.address, config.cloud.api_key) == ("127.0.0.1:1", "k")
    assert load_edge_config(edge_args("daemon.port=8999", port=8998)).daemon.port == 8998


def test_edge_backend_and_draft_model_keep_the_companions_set_beside_them():
    # --backend picks its model file unless the command line names one (--set included).
    picked = load_edge_config(edge_args(backend="onnxruntime"))
    assert picked.draft.model_path.resolve() == DRAFT / "tandem-draft.onnx"
    kept = load_edge_config(edge_args(f"draft.model_path={DRAFT}", backend="torch"))
    assert (kept.draft.backend, kept.draft.model_path.resolve()) == ("torch", DRAFT)
    # --draft-model reads the tokenizer beside it unless the command line names one.
    gguf = DRAFT / "tandem-draft-f32.gguf"
    beside = load_edge_config(edge_args(f"draft.tokenizer_dir={ROOT / 'models/tandem-small'}",
                                        draft_model=gguf))
    assert beside.draft.resolved_tokenizer_dir.resolve() == ROOT / "models/tandem-small"


def test_sim_set_reaches_keys_that_have_flags():
    parse = build_parser().parse_args
    config = sim_config(parse(["sim", "--set", "prompts=3", "--set", "max_tokens=9",
                               "--set", "concurrency=2", "--set", "profiles=[lan]"]))
    assert (config.prompts, config.max_tokens, config.concurrency) == (3, 9, 2)
    assert list(config.profiles) == ["lan"]
    assert sim_config(parse(["sim", "--set", "prompts=3", "--prompts", "5"])).prompts == 5


def test_bench_set_reaches_keys_that_have_flags():
    parse = bench_parser().parse_args
    config = bench_config(parse(["bench", "--set", "prompts=3", "--set", "max_tokens=9",
                                 "--set", "workers=2", "--set", "configurations=[adaptive]",
                                 "--set", "devices=[laptop]"]))
    assert (config.prompts, config.max_tokens, config.workers) == (3, 9, 2)
    assert list(config.configurations) == ["adaptive"] and list(config.devices) == ["laptop"]
    assert bench_config(parse(["bench", "--set", "workers=2", "--workers", "1"])).workers == 1
