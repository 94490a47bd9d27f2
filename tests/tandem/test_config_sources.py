"""Configuration from files, the environment and the command line (tandem/config.py): any subset
of keys in a file, every key from TANDEM_<APP>_<SECTION>__<KEY>, the documented precedence
(command line > environment > file > defaults), and errors that name where the user wrote the
bad key with the nearest valid one; the README's YAML snippets load as written; the CLIs answer
--help / --version without torch and fail in one line."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cloud.config import CloudConfig
from edge.config import EdgeConfig
from tandem.config import ConfigError, load_config, merge, parse_set_options

pytestmark = pytest.mark.e2e  # module-level tier (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("TANDEM_CLOUD_", "TANDEM_EDGE_", "TANDEM_SIM_")):
            monkeypatch.delenv(name)
    return monkeypatch


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_file_may_hold_any_subset_of_keys(tmp_path, clean_env):
    cloud = load_config(write(tmp_path, "model:\n  path: models/tandem-target\n"), CloudConfig,
                        env_prefix="TANDEM_CLOUD_")
    assert cloud.server.host == "127.0.0.1" and cloud.server.port == 50051
    edge = load_config(write(tmp_path, "draft:\n  n_ctx: 512\n"), EdgeConfig,
                       {"client": {"draft_length": None}}, env_prefix="TANDEM_EDGE_")
    assert edge.draft.n_ctx == 512 and edge.client.draft_length == 4  # None = not given
    assert load_config(write(tmp_path, ""), CloudConfig) == CloudConfig()


def test_precedence_cli_over_env_over_file_over_defaults(tmp_path, clean_env):
    path = write(tmp_path, "server:\n  port: 1111\n  host: 127.0.0.2\nlimits:\n  max_sessions: 3\n")
    clean_env.setenv("TANDEM_CLOUD_SERVER__PORT", "2222")
    clean_env.setenv("TANDEM_CLOUD_LIMITS__MAX_SESSIONS", "5")
    clean_env.setenv("tandem_cloud_batch__max_batch", "7")        # case-insensitive
    clean_env.setenv("TANDEM_CLOUD_SERVER__API_KEYS", '["k1", "k2"]')  # lists as JSON
    config = load_config(path, CloudConfig, {"server": {"port": 3333}}, env_prefix="TANDEM_CLOUD_")
    assert config.server.port == 3333                 # command line
    assert config.limits.max_sessions == 5            # environment over file
    assert config.server.host == "127.0.0.2"          # file
    assert config.batch.max_batch == 7 and config.server.api_keys == ("k1", "k2")
    assert config.batch.window_ms == 2.0              # default
    # Without an env prefix the environment is not read (tests, the simulation).
    assert load_config(path, CloudConfig).server.port == 1111


def test_set_options_reach_any_key_and_named_flags_win(clean_env):
    overrides = merge(parse_set_options(["client.max_retries=2", "daemon.cors_origins=[a, b]",
                                         "cloud.tls=true", "daemon.model_name=x"]),
                      {"daemon": {"model_name": "y"}})
    config = load_config(None, EdgeConfig, overrides, env_prefix="TANDEM_EDGE_")
    assert config.client.max_retries == 2 and config.cloud.tls is True
    assert config.daemon.cors_origins == ["a", "b"] and config.daemon.model_name == "y"
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_set_options(["client.max_retries"])


@pytest.mark.parametrize("text, expected", [
    ("server:\n  hots: 0.0.0.0\n", r"c\.yaml: unknown key 'server\.hots' \(did you mean 'server\.host'\?\)"),
    ("modle:\n  path: x\n", r"unknown key 'modle' \(did you mean 'model'\?\)"),
    ("server:\n  port: 99999\n", r"c\.yaml: server\.port: Input should be less than or equal to 65535 \(got 99999\)"),
    ("server: 5\n", r"c\.yaml: server: "),
    ("- a list\n", r"c\.yaml: expected a mapping"),
    ("server: [\n", r"c\.yaml: not valid YAML"),
])
def test_file_errors_name_the_file_the_key_and_a_suggestion(tmp_path, clean_env, text, expected):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), CloudConfig, env_prefix="TANDEM_CLOUD_")
    assert re.search(expected, str(info.value)), str(info.value)
    assert "\n" not in str(info.value)


def test_env_and_cli_errors_name_their_source(tmp_path, clean_env):
    clean_env.setenv("TANDEM_EDGE_CLIENT__DRAFT_LENGHT", "3")
    with pytest.raises(ConfigError, match=r"environment TANDEM_EDGE_CLIENT__DRAFT_LENGHT: unknown "
                                          r"key 'client\.draft_lenght' \(did you mean "
                                          r"'client\.draft_length'\?\)"):
        load_config(None, EdgeConfig, env_prefix="TANDEM_EDGE_")
    clean_env.delenv("TANDEM_EDGE_CLIENT__DRAFT_LENGHT")
    with pytest.raises(ConfigError, match=r"command line: client\.draft_length: .*less than or "
                                          r"equal to 64 \(got 999\)"):
        load_config(None, EdgeConfig, {"client": {"draft_length": 999}}, env_prefix="TANDEM_EDGE_")


def test_a_missing_file_is_named_as_the_user_typed_it(clean_env):
    with pytest.raises(ConfigError, match=r"^config file not found: nope/edge\.yaml$"):
        load_config("nope/edge.yaml", EdgeConfig)


def _readme_yaml_snippets() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```yaml\n(.*?)```", text, flags=re.S)


def test_readme_yaml_snippets_load_as_written(tmp_path, clean_env):
    """Every ```yaml block of the README is a cloud or an edge config (by its top-level keys)
    and loads as written."""
    snippets = _readme_yaml_snippets()
    assert snippets, "the README has no yaml snippets"
    cloud_keys, edge_keys = set(CloudConfig.model_fields), set(EdgeConfig.model_fields)
    for snippet in snippets:
        keys = set(yaml.safe_load(snippet) or {})
        schema = CloudConfig if keys <= cloud_keys else EdgeConfig if keys <= edge_keys else None
        assert schema is not None, f"README snippet is neither a cloud nor an edge config:\n{snippet}"
        load_config(write(tmp_path, snippet), schema)


# ---- the command lines ----------------------------------------------------------------------

def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "importtime", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("module", ["edge.cli", "cloud.cli", "sim.cli", "bench.cli"])
def test_help_and_version_do_not_import_torch(module):
    for flag in ("--help", "--version"):
        result = run_cli("-m", module, flag)
        assert result.returncode == 0, result.stderr[-2000:]
        imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "torch" not in imported and "grpc" not in imported, (module, flag)
    assert re.search(r"\d+\.\d+", result.stdout)  # the --version line


@pytest.mark.parametrize("args, message", [
    (["-m", "cloud.cli", "serve", "--log-level", "verbose"], "not a log level"),
    (["-m", "cloud.cli", "serve", "--config", "nope.yaml"], "config file not found: nope.yaml"),
    (["-m", "cloud.cli", "serve", "--model", "nope-model"], "nope-model"),
    (["-m", "edge.cli", "serve", "--set", "daemon.prot=1"], "did you mean 'daemon.port'"),
    (["-m", "edge.cli", "generate", "--prompt", "x", "--max-tokens", "2", "--backend",
      "llama.cpp", "--draft-model", "models/tandem-draft/tandem-draft.onnx"],
     "draft.backend llama.cpp reads a .gguf file"),
])
def test_cli_errors_are_one_line(args, message):
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and message in lines[-1], result.stderr


def test_sim_profiles_subset_and_unknown_profile(clean_env):
    """The README's `tandem sim --profiles lan,lte` loads with the shipped sim.yaml (its flaky
    overrides kept for later runs); an unknown profile is named, with the nearest one."""
    from sim.config import SimConfig
    config = load_config("configs/sim.yaml", SimConfig, {"profiles": ["lan", "lte"]},
                         env_prefix="TANDEM_SIM_")
    assert config.profiles == ("lan", "lte") and "flaky" in config.profile_overrides
    with pytest.raises(ConfigError, match=r"command line: profiles: unknown channel profile "
                                          r"'ltee' \(did you mean 'lte'\?\)"):
        load_config("configs/sim.yaml", SimConfig, {"profiles": ["lan", "ltee"]})
