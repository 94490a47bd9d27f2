"""Exporters of an HF draft to the formats the edge runtimes read.

    python -m models.export.gguf --hf DIR [--out FILE.gguf]   # llama.cpp, f32 weights
    python -m models.export.onnx --hf DIR [--out FILE.onnx]   # ONNX Runtime, with KV-cache inputs/outputs

Both read only the HF directory (config.json, *.safetensors, tokenizer.json) and take every
dimension from its config. The GGUF exporter writes the llama, mistral, qwen2 and qwen3 families
(byte-level or SentencePiece-style tokenizers) and refuses others in one line; the ONNX exporter
the llama family.
"""
