"""Draft runtime on ONNX Runtime, for the graph written by models.export.onnx.

The KV cache lives here as numpy arrays [1, H_kv, P, D] per layer (past_key_i / past_value_i);
each run returns the grown cache, and rolling back is slicing along the sequence axis."""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from edge.runtime.base import DraftRuntime
from edge.runtime.vocab import check_vocab_fits, tokenizer_json_fingerprint, tokenizer_json_vocab

SEQ_AXIS = 2


class OnnxDraftRuntime(DraftRuntime):
    name = "onnxruntime"

    def __init__(self, model_path: Path, tokenizer_dir: Path | None = None, n_ctx: int = 1024,
                 threads: int = 1) -> None:
        super().__init__()
        model_path = Path(model_path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # One small graph per call: a second pool for parallel branches only costs wake-ups.
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])

        inputs = {i.name: i for i in self.session.get_inputs()}
        self._past_names = [name for name in inputs if name.startswith("past_")]
        self._present_names = ["present_" + name[len("past_"):] for name in self._past_names]
        missing = {"input_ids", "position_ids"} - inputs.keys()
        if missing or not self._past_names:
            raise ValueError(f"{model_path}: not a models.export.onnx graph (inputs {sorted(inputs)})")
        _, kv_heads, _, head_dim = inputs[self._past_names[0]].shape
        self._empty_past = np.zeros((1, kv_heads, 0, head_dim), dtype=np.float32)
        logits_shape = self.session.get_outputs()[0].shape                                  # [1, seq, vocab]
        self.vocab_size = int(logits_shape[-1])
        self.n_ctx = n_ctx

        tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else model_path.parent
        vocab = tokenizer_json_vocab(tokenizer_dir)
        check_vocab_fits(vocab, self.vocab_size, str(model_path))
        self._fingerprint = tokenizer_json_fingerprint(tokenizer_dir)
        self._past = [self._empty_past] * len(self._past_names)

    @property
    def position(self) -> int:
        return self._past[0].shape[SEQ_AXIS]

    def extend(self, token_ids: Sequence[int]) -> torch.Tensor:
        self._check_extend(token_ids)
        start = time.perf_counter()
        n, p = len(token_ids), self.position
        feed = {"input_ids": np.asarray([token_ids], dtype=np.int64),                     # [1, n]
                "position_ids": np.arange(p, p + n, dtype=np.int64)[None]}                # [1, n]
        feed.update(zip(self._past_names, self._past))
        logits, *present = self.session.run(["logits", *self._present_names], feed)
        self._past = present
        assert self.position == p + n
        self.speed.record(n, time.perf_counter() - start)
        return torch.from_numpy(logits[0])                                                # [n, vocab]

    def rollback(self, position: int) -> None:
        self._check_rollback(position)
        if position == 0:
            self._past = [self._empty_past] * len(self._past_names)
        elif position < self.position:
            # Contiguous copies: ORT would otherwise copy the strided view on every later run.
            self._past = [np.ascontiguousarray(t[:, :, :position]) for t in self._past]

    def fingerprint(self) -> str:
        return self._fingerprint
