"""A second prompt source: prose from the held-out files (docstrings and comment blocks), so
fast mode's calibration is measured on text other than code openings (issue 30).

Only code ships as prompts (prompts/heldout.jsonl: the starts of functions and classes); the
held-out files' docstrings and comments are English prose the models never saw in training.
Each prompt is a docstring (or a comment block of two lines or more) cut after its first line,
with the two lines of code before it: the continuation the model writes is prose. Written once
to models/prompts/heldout_prose.jsonl (a run needs no interpreter sources):

    python -m models.train.prose_prompts
"""
from __future__ import annotations

import ast
import json
import random
from pathlib import Path

from models.train.corpus import corpus_files, split

OUT = Path("models/prompts/heldout_prose.jsonl")
MIN_REST_CHARS = 80  # the part of the docstring / comment block after the cut: prose to write


def docstring_prompts(text: str, relpath: str) -> list[dict]:
    """A prompt per multi-line docstring: two lines before it and its first line."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not body or not isinstance(body[0], ast.Expr):
            continue
        value = body[0].value
        if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
            continue
        first, last = value.lineno - 1, value.end_lineno - 1
        rest = "".join(lines[first + 1:last + 1])
        if last - first < 2 or len(rest.strip()) < MIN_REST_CHARS:
            continue
        out.append({"file": relpath, "line": first + 1, "kind": "docstring",
                    "prompt": "".join(lines[max(0, first - 2):first + 1])})
    return out


def comment_prompts(text: str, relpath: str) -> list[dict]:
    """A prompt per comment block (>= 3 comment lines in a row): two lines before it and its
    first line."""
    lines = text.splitlines(keepends=True)
    out, i = [], 0
    while i < len(lines):
        j = i
        while j < len(lines) and lines[j].lstrip().startswith("#"):
            j += 1
        if j - i >= 3 and len("".join(lines[i + 1:j]).strip()) >= MIN_REST_CHARS:
            out.append({"file": relpath, "line": i + 1, "kind": "comment",
                        "prompt": "".join(lines[max(0, i - 2):i + 1])})
        i = max(j, i + 1)
    return out


def main() -> None:
    rng = random.Random(0)
    _, heldout = split(corpus_files())
    prompts = []
    for f in heldout:
        text = f.read()
        found = docstring_prompts(text, f.relpath) + comment_prompts(text, f.relpath)
        rng.shuffle(found)
        prompts.extend(p for p in found[:16] if 20 <= len(p["prompt"]) <= 700)
    rng.shuffle(prompts)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    print(f"{len(prompts)} prose prompts from {len(heldout)} held-out files -> {OUT}")


if __name__ == "__main__":
    main()
