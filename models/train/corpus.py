"""The training corpus: the CPython standard library sources that ship with the interpreter.

Files are split into train and held-out *by file* with a stable hash of their path relative to
the stdlib root, so the split is the same on every machine with the same Python version and a
held-out file never contributes a single token to training.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELDOUT_PERCENT = 4  # share of files held out for evaluation (by stable path hash)
EXCLUDED_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"}
MAX_FILE_BYTES = 400_000  # a handful of generated tables dominate otherwise


@dataclass(frozen=True)
class CorpusFile:
    relpath: str
    path: Path

    @property
    def heldout(self) -> bool:
        digest = hashlib.sha256(self.relpath.encode()).digest()
        return int.from_bytes(digest[:4], "little") % 100 < HELDOUT_PERCENT

    def read(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path | None = None) -> list[CorpusFile]:
    """All eligible .py files under the stdlib root, sorted by relative path."""
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if EXCLUDED_PARTS.intersection(rel.parts[:-1]) or path.stat().st_size > MAX_FILE_BYTES:
            continue
        files.append(CorpusFile(rel.as_posix(), path))
    return files


def split(files: list[CorpusFile]) -> tuple[list[CorpusFile], list[CorpusFile]]:
    train = [f for f in files if not f.heldout]
    heldout = [f for f in files if f.heldout]
    return train, heldout
