"""edge/config.py: the shipped configs/edge.yaml validates; a misspelt key and inconsistent
bounds are refused."""
from __future__ import annotations

import pytest

from edge.config import ClientConfig, EdgeConfig

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


def test_edge_yaml_validates(tmp_path):
    from pathlib import Path

    from tandem.config import ConfigError, load_config
    root = Path(__file__).resolve().parents[2]
    config = load_config(root / "configs/edge.yaml", EdgeConfig)
    assert config.draft.backend == "llama.cpp" and config.client.draft_length == 4
    assert config.cloud.address == "127.0.0.1:50051"
    bad = tmp_path / "bad.yaml"
    bad.write_text("client:\n  draft_lenght: 3\n")
    with pytest.raises(ConfigError):
        load_config(bad, EdgeConfig)
    with pytest.raises(ValueError):
        ClientConfig(retry_initial_backoff_s=3.0, retry_max_backoff_s=1.0)
