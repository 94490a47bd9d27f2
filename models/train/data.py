"""Tokenised corpus on disk: one uint16 stream per split, files joined by the EOS token."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from models.train.corpus import CorpusFile, corpus_files, split


def encode_files(tokenizer, files: list[CorpusFile]) -> np.ndarray:
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for f in files:
        ids.extend(tokenizer(f.read(), add_special_tokens=False)["input_ids"])
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def prepare(tokenizer_dir: Path, cache_dir: Path) -> dict[str, Path]:
    """Tokenise both splits once; later calls reuse the files in cache_dir."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = {"train": cache_dir / "train.bin", "heldout": cache_dir / "heldout.bin"}
    if all(p.exists() for p in paths.values()):
        return paths
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    train_files, heldout_files = split(corpus_files())
    for name, files in (("train", train_files), ("heldout", heldout_files)):
        arr = encode_files(tokenizer, files)
        arr.tofile(paths[name].with_suffix(".tmp"))
        paths[name].with_suffix(".tmp").rename(paths[name])
        print(f"{name}: {len(files)} files, {len(arr):,} tokens")
    return paths


def load(path: Path) -> np.ndarray:
    return np.memmap(path, dtype=np.uint16, mode="r")


def write_heldout_list(out: Path) -> None:
    _, heldout_files = split(corpus_files())
    out.write_text("".join(f.relpath + "\n" for f in heldout_files))
