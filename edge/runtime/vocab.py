"""The vocabulary an edge runtime reads, from an HF tokenizer.json (torch and ONNX backends)."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from tandem.fingerprint import tokenizer_fingerprint


def tokenizer_json_vocab(tokenizer_dir: Path) -> dict[str, int]:
    """token string -> id, added special tokens included (what an HF tokenizer's get_vocab() returns)."""
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {tokenizer_dir}")
    return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)


def check_vocab_fits(vocab: dict[str, int], logits_width: int, where: str) -> None:
    """A tokenizer with ids the model has no logit for would draft garbage: refuse at load."""
    top = max(vocab.values()) + 1
    if top > logits_width:
        raise ValueError(f"{where}: tokenizer has ids up to {top - 1} but the model outputs {logits_width} logits")


def tokenizer_json_fingerprint(tokenizer_dir: Path) -> str:
    """The vocabulary and the tokenizer's kind (byte-level, sentencepiece, ...) hashed together."""
    return tokenizer_fingerprint(Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json")))
