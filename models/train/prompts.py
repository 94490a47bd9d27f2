"""Held-out code-completion prompts: the first lines of functions and classes from held-out
files, cut at a line end. Written once to models/prompts/heldout.jsonl, which tests, benchmarks
and the simulation read (so a run does not need the interpreter's sources).

    python -m models.train.prompts
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from models.train.corpus import corpus_files, split

OUT = Path("models/prompts/heldout.jsonl")


def prompts_from(text: str, relpath: str, rng: random.Random, per_file: int) -> list[dict]:
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines)
              if line.lstrip().startswith(("def ", "class ")) and i + 4 < len(lines)]
    rng.shuffle(starts)
    out = []
    for i in sorted(starts[:per_file]):
        # The definition line and a few lines of its body: enough context for a completion.
        take = rng.randint(2, 6)
        prompt = "".join(lines[max(0, i - 2) : i + take])
        if 40 <= len(prompt) <= 700:
            out.append({"file": relpath, "line": i + 1, "prompt": prompt})
    return out


def main() -> None:
    rng = random.Random(0)
    _, heldout = split(corpus_files())
    prompts = []
    for f in heldout:
        prompts.extend(prompts_from(f.read(), f.relpath, rng, per_file=16))
    rng.shuffle(prompts)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    print(f"{len(prompts)} prompts from {len(heldout)} held-out files -> {OUT}")


if __name__ == "__main__":
    main()
