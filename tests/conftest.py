"""Shared fixtures: the shipped model family and held-out prompts.

tests/ is grouped the way the code is (edge/, cloud/, tandem/, sim/, bench/, models/, and
system/ for the whole system end to end); the helpers the groups share (a verifier harness, a
scripted link, model builders) are in tests/helpers/, put on sys.path here so a test imports
them by name (`from verifier_harness import ...`).

Tests run on the real shipped models in models/. While the family is being (re)trained,
TANDEM_TEST_MODELS=dev points the same fixtures at the randomly initialised development copies
in models/.cache/dev-* (plumbing only; numbers from them mean nothing).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`pytest -m unit` reads only the test files that mark tests `unit`: importing the others
    (their fixtures load models, start servers) would take longer than the unit tests run."""
    if (config.getoption("markexpr") != "unit" or collection_path.suffix != ".py"
            or not collection_path.name.startswith("test_")):
        return None
    return True if "pytest.mark.unit" not in collection_path.read_text() else None


def _family() -> dict[str, Path]:
    if os.environ.get("TANDEM_TEST_MODELS") == "dev":
        target, draft = MODELS / ".cache/dev-target", MODELS / ".cache/dev-draft"
    else:
        target, draft = MODELS / "tandem-target", MODELS / "tandem-draft"
    return {"target": target, "draft": draft,
            "gguf": draft / "tandem-draft-f32.gguf", "onnx": draft / "tandem-draft.onnx"}


@pytest.fixture(scope="session")
def target_dir() -> Path:
    return _family()["target"]


@pytest.fixture(scope="session")
def draft_dir() -> Path:
    return _family()["draft"]


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return _family()["gguf"]


@pytest.fixture(scope="session")
def onnx_path() -> Path:
    return _family()["onnx"]


@pytest.fixture(scope="session")
def small_dir() -> Path:
    """The edge ladder's middle rung (HF directory; its GGUF and ONNX beside it)."""
    return MODELS / "tandem-small"


LOCAL_MODELS = ("tandem-draft", "tandem-small")


@pytest.fixture(scope="session", params=LOCAL_MODELS)
def local_model(request) -> dict[str, Path]:
    """Each shipped local model in turn: its HF directory, GGUF and ONNX files."""
    if request.param == "tandem-draft":
        family = _family()
        return {"dir": family["draft"], "gguf": family["gguf"], "onnx": family["onnx"]}
    model = MODELS / request.param
    return {"dir": model, "gguf": model / f"{model.name}-f32.gguf", "onnx": model / f"{model.name}.onnx"}


@pytest.fixture(scope="session")
def heldout_prompts() -> list[str]:
    """Held-out code prompts (models/prompts/heldout.jsonl), in a fixed order."""
    lines = (MODELS / "prompts/heldout.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines]
