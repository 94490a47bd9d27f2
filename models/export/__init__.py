"""Exporters of an HF LLaMA draft to the formats the edge runtimes read.

    python -m models.export.gguf --hf DIR [--out FILE.gguf]   # llama.cpp, f32 weights
    python -m models.export.onnx --hf DIR [--out FILE.onnx]   # ONNX Runtime, with KV-cache inputs/outputs

Both read only the HF directory (config.json, *.safetensors, tokenizer.json) and take every
dimension from its config, so they work on any LLaMA-architecture model, not just ours.
"""
