"""Code shared by the edge and the cloud: sampling warps, the sparse-distribution codec and the
tokenizer fingerprint. It imports neither `edge` nor `cloud`, so both can depend on it."""
