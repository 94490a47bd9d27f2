"""The target's identity: its served name plus a hash of its weights and its tokenizer.

Two targets that share a tokenizer read the same ids, so the tokenizer fingerprint alone cannot
tell them apart; a token "verified" by the wrong one is a lie. The verifier reports this identity
in Opened and InfoReply (tandem.v1.TargetIdentity); an edge may pin `digest` in its config and
checks it on every open and re-open.

weights_digest hashes the files that decide what the model computes (config.json and every
weight file, in name order), not the loaded tensors, so it is the same on every device and
dtype the files are loaded with; the dtype is reported separately in Info.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

WEIGHT_PATTERNS = ("config.json", "*.safetensors", "*.bin", "*.pt", "*.pth")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class TargetIdentity:
    name: str
    weights_digest: str         # "sha256:<hex>" over config.json and the weight files
    tokenizer_fingerprint: str  # tandem.fingerprint.tokenizer_fingerprint

    @property
    def digest(self) -> str:
        """What an edge pins: the weights and the tokenizer together (the name is a label)."""
        h = hashlib.sha256(f"{self.weights_digest}\n{self.tokenizer_fingerprint}\n".encode())
        return "sha256:" + h.hexdigest()

    def describe(self) -> str:
        return f"{self.name} ({self.digest[:19]})"


def weights_digest(model_dir: Path) -> str:
    """sha256 over (relative name, size, bytes) of each weight file of an HF model directory."""
    model_dir = Path(model_dir)
    files = sorted({path for pattern in WEIGHT_PATTERNS for path in model_dir.glob(pattern)
                    if path.is_file()})
    if not files:
        raise FileNotFoundError(f"{model_dir}: no config.json or weight files to identify")
    h = hashlib.sha256()
    for path in files:
        h.update(f"{path.name}\t{path.stat().st_size}\n".encode())
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def identify(model_dir: Path, name: str, tokenizer_fingerprint: str) -> TargetIdentity:
    return TargetIdentity(name=name, weights_digest=weights_digest(model_dir),
                          tokenizer_fingerprint=tokenizer_fingerprint)
