"""Chat prompts: the tokenizer's own chat template when it has one, else the documented plain
join of the shipped code models.

A chat template is the Jinja2 program in tokenizer_config.json (`chat_template`, a string or a
list of named templates) or in chat_template.jinja next to it. It is rendered here the way
transformers' `apply_chat_template` renders it (a sandboxed Jinja2 environment with
`trim_blocks`/`lstrip_blocks`, the `raise_exception` and `strftime_now` globals and a `tojson`
filter that keeps non-ASCII), so the edge needs only Jinja2, not transformers; a test checks
the two give the same text.

The shipped models are code LMs without chat training and without a template: their prompt is
the messages' contents in order, joined by one newline, roles not rendered.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

PLAIN_SEPARATOR = "\n"


class TemplateError(ValueError):
    """The messages cannot be rendered (the template raised, or it takes no tools)."""


def plain_chat_prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """The documented prompt of the shipped code models: contents joined by one newline."""
    return PLAIN_SEPARATOR.join(str(m.get("content") or "") for m in messages)


class ChatTemplate:
    """The chat template of a tokenizer directory (or none)."""

    def __init__(self, source: str | None, bos_token: str | None = None,
                 eos_token: str | None = None) -> None:
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    @classmethod
    def from_dir(cls, tokenizer_dir: Path | str) -> ChatTemplate:
        directory = Path(tokenizer_dir)
        config: dict[str, Any] = {}
        if (directory / "tokenizer_config.json").is_file():
            config = json.loads((directory / "tokenizer_config.json").read_text())
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default") or next(iter(named.values()), None)
        jinja_file = directory / "chat_template.jinja"
        if not source and jinja_file.is_file():
            source = jinja_file.read_text()
        return cls(source or None, _token_text(config.get("bos_token")),
                   _token_text(config.get("eos_token")))

    @property
    def has_template(self) -> bool:
        return self.source is not None

    @property
    def takes_tools(self) -> bool:
        """Whether the template renders a `tools` variable at all."""
        return self.source is not None and "tools" in self.source

    @cached_property
    def _compiled(self):
        from jinja2 import TemplateError as JinjaError  # noqa: F401 - imported with jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.source)

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping] | None = None,
               add_generation_prompt: bool = True, extra: Mapping[str, Any] | None = None) -> str:
        """The prompt text for `messages` (dicts in the OpenAI shape); `extra`: more template
        variables (a request's chat_template_kwargs), never replacing the ones set here."""
        if self.source is None:
            if tools:
                raise TemplateError("this model has no chat template, so it cannot be given "
                                    "tools; send the tool descriptions in a message instead")
            return plain_chat_prompt(messages)
        if tools and not self.takes_tools:
            raise TemplateError("this model's chat template does not render tools")
        from jinja2 import TemplateError as JinjaError
        variables = {**(extra or {}), "messages": list(messages),
                     "tools": list(tools) if tools else None,
                     "add_generation_prompt": add_generation_prompt,
                     "bos_token": self.bos_token, "eos_token": self.eos_token}
        try:
            return self._compiled.render(**variables)
        except TemplateError:
            raise
        except (JinjaError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise TemplateError(f"the chat template could not render these messages: "
                                f"{exc}") from exc


def _token_text(token: Any) -> str | None:
    if isinstance(token, dict):  # older configs store an AddedToken object
        return token.get("content")
    return token if isinstance(token, str) else None
