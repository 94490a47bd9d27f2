"""Typed configuration of the edge's draft model: which backend runs which file."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from tandem.config import Settings

Backend = Literal["llama.cpp", "onnxruntime", "torch"]


class DraftConfig(Settings):
    backend: Backend = Field(
        "llama.cpp",
        description="Draft runtime: 'llama.cpp' (GGUF file), 'onnxruntime' (ONNX file) or 'torch' (HF directory).")
    model_path: Path = Field(
        Path("models/tandem-draft/tandem-draft-f32.gguf"),
        description="The GGUF file, the ONNX file or the HF model directory, matching the backend.")
    tokenizer_dir: Path | None = Field(
        None,
        description="HF directory with tokenizer.json that the edge tokenizes with; default: the draft's HF "
                    "directory (model_path itself for torch, the directory holding the file otherwise).")
    n_ctx: int = Field(1024, ge=16, le=131072, description="Most tokens the draft's KV cache holds.")
    threads: int = Field(2, ge=1, le=256, description="CPU threads the draft computes with.")

    @property
    def resolved_tokenizer_dir(self) -> Path:
        if self.tokenizer_dir is not None:
            return self.tokenizer_dir
        return self.model_path if self.model_path.is_dir() else self.model_path.parent
