"""docs/configuration.md is generated from the typed schemas; it must match them, and every
shipped YAML file must validate against its schema."""
from pathlib import Path

import pytest

from bench import config_reference
from sim.netem.profile import ChannelProfile
from sim.config import SimConfig
from cloud.config import CloudConfig
from edge.config import EdgeConfig
from tandem.config import ConfigError, load_config

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]


def test_reference_page_is_up_to_date():
    assert config_reference.PAGE.read_text() == config_reference.render(), (
        "docs/configuration.md is stale: run python -m bench.config_reference")


def test_reference_lists_every_cloud_key():
    page = config_reference.render()
    for key in ("server.api_keys_env", "model.dtype", "limits.kv_budget_bytes", "batch.window_ms"):
        assert f"`{key}`" in page


@pytest.mark.parametrize("path, schema", [
    ("configs/cloud.yaml", CloudConfig), ("configs/cloud-vllm.yaml", CloudConfig),
    ("configs/edge.yaml", EdgeConfig),
    ("configs/sim.yaml", SimConfig),
    *[(str(p.relative_to(ROOT)), ChannelProfile) for p in sorted((ROOT / "configs/channels").glob("*.yaml"))],
])
def test_shipped_configs_validate(path, schema):
    load_config(ROOT / path, schema)


def test_unknown_key_is_an_error(tmp_path):
    bad = tmp_path / "cloud.yaml"
    bad.write_text("server:\n  hots: 127.0.0.1\n")
    with pytest.raises(ConfigError, match="hots"):
        load_config(bad, CloudConfig)
