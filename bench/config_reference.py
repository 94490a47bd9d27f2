"""Write the configuration reference (docs/configuration.md) from the typed schemas themselves,
so the page cannot drift from the code: every key, its type, default and description.

    python -m bench.config_reference            # rewrite docs/configuration.md
    python -m bench.config_reference --check    # exit 1 when the page is out of date
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import get_args

from pydantic import BaseModel

from sim.netem.profile import ChannelProfile
from sim.config import SimConfig
from cloud.config import CloudConfig
from edge.config import EdgeConfig

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
SCHEMAS = [
    ("configs/cloud.yaml", "tandem-cloud serve", CloudConfig),
    ("configs/edge.yaml", "tandem-edge generate / serve", EdgeConfig),
    ("configs/sim.yaml", "tandem sim", SimConfig),
    ("configs/channels/*.yaml", "channel profiles (sim.netem, tandem sim)", ChannelProfile),
]


def _nested_model(annotation) -> type[BaseModel] | None:
    candidates = [annotation, *get_args(annotation)]
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def _type_name(annotation) -> str:
    text = getattr(annotation, "__name__", None) if not get_args(annotation) else None
    return (text or str(annotation)).replace("typing.", "").replace("pathlib.", "")


def rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    out = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested = _nested_model(field.annotation)
        if nested is not None and nested is field.annotation:
            out.extend(rows(nested, key + "."))
            continue
        value = None if field.is_required() else field.get_default(call_default_factory=True)
        default = "required" if field.is_required() else repr(str(value) if isinstance(value, Path) else value)
        out.append((key, _type_name(field.annotation), default, (field.description or "").replace("\n", " ")))
        if nested is not None:
            out.extend(rows(nested, key + "[]."))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    lines = ["# Configuration reference", "",
             "Generated from the typed schemas by `python -m bench.config_reference`; do not edit by hand.",
             "Every YAML file validates into these classes; unknown keys are errors.", ""]
    for path, used_by, schema in SCHEMAS:
        lines += [f"## `{path}` — {used_by}", "", f"Schema: `{schema.__module__}.{schema.__name__}`", "",
                  "| key | type | default | description |", "|---|---|---|---|"]
        for key, typ, default, desc in rows(schema):
            lines.append(f"| `{key}` | `{_cell(typ)}` | `{_cell(default)}` | {_cell(desc)} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            sys.exit(f"{PAGE} is out of date: run python -m bench.config_reference")
        return
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
