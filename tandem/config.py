"""Typed configuration: every knob is a pydantic field with its default, bounds and description
in one place; YAML files validate into the same classes (unknown keys are errors)."""
from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

T = TypeVar("T", bound="Settings")

REPO_ROOT = Path(__file__).resolve().parents[1]


def resolve_path(path: Path) -> Path:
    """A relative path as given when it exists from the current directory, else against the
    repository root (so the shipped configs and models are found from any directory)."""
    if path.is_absolute() or path.exists():
        return path
    return REPO_ROOT / path


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(ValueError):
    """A configuration file that is missing, not YAML, or does not match its schema."""


def load_config(path: Path | str, cls: type[T], overrides: dict | None = None) -> T:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    _merge(raw, overrides or {})
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _merge(into: dict, overrides: dict) -> None:
    """Deep-merge CLI overrides (nested dicts) into the raw YAML; None means "not given"."""
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
