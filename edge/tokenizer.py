"""Text <-> token ids on the edge with the HF `tokenizers` library alone (transformers is too
heavy for a device): tokenizer.json for the vocabulary, tokenizer_config.json for the eos."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer


class EdgeTokenizer:
    def __init__(self, tokenizer_dir: Path | str) -> None:
        tokenizer_dir = Path(tokenizer_dir)
        path = tokenizer_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {tokenizer_dir}")
        self._tokenizer = Tokenizer.from_file(str(path))
        self.directory = tokenizer_dir  # where tokenizer_config.json (chat template) lives
        self.eos_id = self._eos_id(tokenizer_dir)

    def _eos_id(self, tokenizer_dir: Path) -> int | None:
        config = tokenizer_dir / "tokenizer_config.json"
        if not config.is_file():
            return None
        eos = json.loads(config.read_text()).get("eos_token")
        if isinstance(eos, dict):  # older configs store an AddedToken object
            eos = eos.get("content")
        return self._tokenizer.token_to_id(eos) if eos else None

    @property
    def stop_ids(self) -> frozenset[int]:
        """What ends a generation by default: the eos token, when the tokenizer has one."""
        return frozenset() if self.eos_id is None else frozenset({self.eos_id})

    @property
    def hf_tokenizer(self) -> Tokenizer:
        """The `tokenizers` object itself (for its native incremental decode stream)."""
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        # No special tokens added: prompts are plain text, exactly as the target was trained on.
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)
