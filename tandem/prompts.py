"""The held-out prompts, loaded one way for the simulation, the benchmarks and the training
scripts: `load_prompts` (a JSONL file's prompts, cycling) and the fast-mode sources with their
fit / eval split (issue 30).

Two sources ship, both cut from the 19 held-out stdlib files the models never saw:
  code   models/prompts/heldout.jsonl        starts of functions and classes (models/train/prompts.py)
  prose  models/prompts/heldout_prose.jsonl  docstrings and comment blocks cut after their first
                                             line (models/train/prose_prompts.py)

Fast mode's shipped calibration prior (models/fast-calibration.json) is fitted on the *fit*
files' code prompts only; benchmarks of fast mode use the *eval* files (a stable hash of the
file path decides, so no prompt of an eval file, code or prose, was seen by the fit).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

SOURCES = {"code": Path("models/prompts/heldout.jsonl"),
           "prose": Path("models/prompts/heldout_prose.jsonl")}
SPLITS = ("fit", "eval", "all")


def load_prompts(path: Path, count: int, offset: int = 0, max_chars: int = 1200) -> list[str]:
    """`count` prompts from a JSONL file of {"prompt": ...} lines, starting at `offset`, cycling
    when the file is shorter; each keeps at most its last `max_chars` characters."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"no prompts in {path}")
    prompts = [json.loads(lines[(offset + i) % len(lines)])["prompt"] for i in range(count)]
    return [p[-max_chars:] for p in prompts]


def is_fit_file(relpath: str) -> bool:
    """Whether a held-out file's prompts may fit the calibration prior (about half the files)."""
    return hashlib.sha256(f"fit:{relpath}".encode()).digest()[0] % 2 == 0


def load_source(path: Path, split: str = "eval", count: int | None = None, offset: int = 0,
                max_chars: int = 2000) -> list[str]:
    """The prompts of one source file in `split` (SPLITS), in file order from `offset`, at most
    `count` (None = all), each its last `max_chars` characters."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    picked = [r["prompt"][-max_chars:] for r in rows
              if split == "all" or is_fit_file(r["file"]) == (split == "fit")]
    picked = picked[offset:]
    return picked if count is None else picked[:count]
