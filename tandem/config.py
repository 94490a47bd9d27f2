"""Typed configuration: every knob is a pydantic field with its default, bounds and description
in one place; YAML files, the environment and the command line all validate into the same
classes (unknown keys are errors).

Where a value comes from, highest precedence first (pydantic-settings merges the sources):

  1. the command line (`--port 9000`, or any key with `--set server.port=9000`)
  2. the environment: `<PREFIX><SECTION>__<KEY>`, e.g. `TANDEM_CLOUD_SERVER__PORT=9000` or
     `TANDEM_EDGE_CLIENT__DRAFT_LENGTH=8` (case-insensitive; lists and mappings as JSON)
  3. the YAML file (`--config`), which may hold any subset of the keys
  4. the defaults of the schema classes

A key that is not in the schema is refused, naming where it was written (the file, the
environment variable or the flag) and the nearest valid key.
"""
from __future__ import annotations

import difflib
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_settings import BaseSettings, InitSettingsSource, SettingsConfigDict

T = TypeVar("T", bound=BaseModel)

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV_NESTED_DELIMITER = "__"


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


def read_yaml(path: Path | str | None) -> dict:
    """The mapping in a YAML file (resolved with resolve_path); errors name the path as given."""
    if path is None:
        return {}
    given = Path(path)
    try:
        raw = yaml.safe_load(resolve_path(given).read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {given}") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{given}: is a directory, not a YAML file") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{given}: not valid YAML: {exc}".replace("\n", " ")) from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{given}: expected a mapping of keys at the top level")
    return raw


def load_config(path: Path | str | None, cls: type[T], overrides: Mapping | None = None,
                env_prefix: str | None = None) -> T:
    """Validate `cls` from the YAML file at `path` (None = no file), the environment variables
    starting with `env_prefix` (None = the environment is not read) and `overrides` (nested
    dicts from the command line; None values mean "not given" and are dropped)."""
    file_data = read_yaml(path)
    cli_data = _drop_none(dict(overrides or {}))
    try:
        return cls.model_validate(_merged(cls, env_prefix, cli_data, file_data))
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc, cls, path, cli_data, env_prefix)) from None


def parse_set_options(items: Sequence[str] | None) -> dict:
    """`--set a.b=VALUE` options as a nested dict; VALUE is read as YAML (numbers, booleans,
    lists), so `--set server.api_keys=[k1,k2]` works."""
    tree: dict = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item}: expected KEY=VALUE, e.g. --set client.draft_length=8")
        try:
            parsed = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            parsed = value
        node = tree
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item}: {part} is given both as a value and a section")
        node[leaf] = parsed
    return tree


def command_line(set_options: Sequence[str] | None, flags: Mapping) -> dict:
    """What a command line overrides, for load_config: the named flags over the `--set
    KEY=VALUE` options. A flag left unset (None, argparse's default) overrides nothing, so it
    never hides a --set of the same key: `--set server.port=P` without `--port` gives P. Every
    CLI that takes --set combines the two here, and only here."""
    return merge(parse_set_options(set_options), _drop_none(flags))


def merge(base: dict, top: Mapping) -> dict:
    """A new dict: `top` deep-merged over `base`."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


# ---- sources ------------------------------------------------------------------------------


class _Sources(BaseSettings):
    """Merges command line > environment > file with pydantic-settings. Its fields mirror the
    schema's top-level keys as plain data (a section as a dict, so nested environment variables
    merge into it): the schema validates the result, so its validators and error locations
    stay the ones the user sees."""

    _pending: ClassVar[tuple[dict, dict]] = ({}, {})
    _read_env: ClassVar[bool] = False

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings,
                                   dotenv_settings, file_secret_settings):
        cli, file = cls._pending
        sources = [InitSettingsSource(settings_cls, init_kwargs=cli)]
        if cls._read_env:
            sources.append(env_settings)
        sources.append(InitSettingsSource(settings_cls, init_kwargs=file))
        return tuple(sources)


_SOURCES_LOCK = threading.Lock()  # _pending is per class: one load at a time
_SOURCE_CLASSES: dict[tuple[type, str | None], type[_Sources]] = {}


def _merged(cls: type[BaseModel], env_prefix: str | None, cli: dict, file: dict) -> dict:
    with _SOURCES_LOCK:
        sources = _sources_class(cls, env_prefix)
        sources._pending = (cli, file)
        try:
            return sources().model_dump(exclude_unset=True)
        finally:
            sources._pending = ({}, {})


def _sources_class(cls: type[BaseModel], env_prefix: str | None) -> type[_Sources]:
    key = (cls, env_prefix)
    if key not in _SOURCE_CLASSES:
        annotations: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            annotations[name] = field.annotation | None
        namespace: dict[str, Any] = {
            "__annotations__": annotations, **{name: None for name in annotations},
            "model_config": SettingsConfigDict(
                extra="allow", env_prefix=env_prefix or "",
                env_nested_delimiter=ENV_NESTED_DELIMITER, case_sensitive=False,
                validate_default=False)}
        namespace["_read_env"] = env_prefix is not None  # ClassVar in _Sources
        _SOURCE_CLASSES[key] = type(f"{cls.__name__}Sources", (_Sources,), namespace)
    return _SOURCE_CLASSES[key]


def _section(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _drop_none(tree: Mapping) -> dict:
    return {key: _drop_none(value) if isinstance(value, Mapping) else value
            for key, value in tree.items() if value is not None}


# ---- errors -------------------------------------------------------------------------------


def describe_errors(exc: ValidationError, cls: type[BaseModel], path: Path | str | None,
                    cli: Mapping, env_prefix: str | None) -> str:
    """One line per problem: where the user wrote it, the key, what is wrong, and for an
    unknown key the nearest valid one."""
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ()) if not isinstance(part, int)]
        key = ".".join(loc)
        where = _where(loc, path, cli, env_prefix)
        if error.get("type") == "extra_forbidden":
            hint = _nearest(cls, loc)
            lines.append(f"{where}: unknown key {key!r}" + (f" (did you mean {hint!r}?)"
                                                            if hint else ""))
        else:
            message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
            shown = f" (got {error['input']!r})" if "input" in error and not isinstance(
                error["input"], (dict, list)) else ""
            lines.append(f"{where}: {key + ': ' if key else ''}{message}{shown}")
    return "; ".join(lines)


def _where(loc: list[str], path, cli: Mapping, env_prefix: str | None) -> str:
    if loc and _has_path(cli, loc):
        return "command line"
    if env_prefix is not None and loc:
        for depth in range(len(loc), 0, -1):
            name = (env_prefix + ENV_NESTED_DELIMITER.join(loc[:depth])).upper()
            if any(var.upper() == name for var in os.environ):
                return f"environment {name}"
    return str(path) if path is not None else "defaults"


def _has_path(tree: Mapping, loc: list[str]) -> bool:
    node: Any = tree
    for part in loc:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _nearest(cls: type[BaseModel], loc: list[str]) -> str | None:
    """The valid key closest to the unknown last part of `loc`, as a dotted path."""
    model: type[BaseModel] | None = cls
    for part in loc[:-1]:
        field = model.model_fields.get(part) if model else None
        model = _model_in(field.annotation) if field else None
    if model is None:
        return None
    match = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    return ".".join([*loc[:-1], match[0]]) if match else None


def _model_in(annotation) -> type[BaseModel] | None:
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None
