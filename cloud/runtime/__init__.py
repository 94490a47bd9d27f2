"""The target model runtime: per-session KV caches (kv.py) and the batched ragged forward
(target.py)."""
