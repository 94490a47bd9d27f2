"""Reference draft runtime: the HF model itself in float32 with a transformers DynamicCache.

Slowest of the three, but it is the model as trained, so the other backends are tested
against it."""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from edge.runtime.base import DraftRuntime
from edge.runtime.vocab import check_vocab_fits, tokenizer_json_fingerprint, tokenizer_json_vocab


class TorchDraftRuntime(DraftRuntime):
    name = "torch"

    def __init__(self, model_dir: Path, tokenizer_dir: Path | None = None, n_ctx: int = 1024,
                 threads: int | None = None) -> None:
        super().__init__()
        if threads is not None:
            # Process-wide in torch: the edge runs one draft per process, so this is its budget.
            torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(Path(model_dir), dtype=torch.float32).eval()
        self.vocab_size = self.model.config.vocab_size
        self.n_ctx = n_ctx
        tokenizer_dir = Path(tokenizer_dir or model_dir)
        vocab = tokenizer_json_vocab(tokenizer_dir)
        check_vocab_fits(vocab, self.vocab_size, str(model_dir))
        self._fingerprint = tokenizer_json_fingerprint(tokenizer_dir)
        self._cache = DynamicCache(config=self.model.config)
        self._position = 0

    @property
    def position(self) -> int:
        return self._position

    @torch.no_grad()
    def extend(self, token_ids: Sequence[int]) -> torch.Tensor:
        self._check_extend(token_ids)
        start = time.perf_counter()
        n = len(token_ids)
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long)                     # [1, n]
        position_ids = torch.arange(self._position, self._position + n, dtype=torch.long)[None]
        out = self.model(input_ids=input_ids, position_ids=position_ids,
                         past_key_values=self._cache, use_cache=True)
        self._position += n
        assert self._cache.get_seq_length() == self._position
        logits = out.logits[0].float()                                                   # [n, vocab]
        self.speed.record(n, time.perf_counter() - start)
        return logits

    def rollback(self, position: int) -> None:
        self._check_rollback(position)
        if position == 0:
            self._cache = DynamicCache(config=self.model.config)
        elif position < self._position:
            # transformers 5: a negative argument is the number of tokens to drop from the end.
            self._cache.crop(position - self._position)
        self._position = position

    def fingerprint(self) -> str:
        return self._fingerprint
