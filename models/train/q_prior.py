"""Build the id prior of the coded draft q (tandem/qcodec.py): how often each token id is kept
in the draft's quantized q, counted over the training split (never the held-out files).

Usage: python -m models.train.q_prior [--draft models/tandem-draft] [--tokens 200000]

Writes tandem/qpriors/<tokenizer fingerprint>.npy ([vocab] uint32 counts). Both ends of a
session load the same file by the tokenizer fingerprint they already agree on; the codec's
name carries a digest of it, so a changed table is negotiated, never misread.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from models.train.corpus import corpus_files, split
from tandem.fingerprint import tokenizer_fingerprint
from tandem.qcodec import CAP, MAX_LEVEL, WEIGHTS, QCodec, prior_path, uniform_prior
from tandem.sampling import SamplingParams, warp

ROOT = Path(__file__).resolve().parents[2]


def count_kept_ids(draft, tokenizer, tokens: int, seq: int = 256,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over QCodec.quantize's q of the draft's T = 0.8 distributions on windows of training
    files (file order shuffled with `seed`; every 4th window): [vocab] counts of kept ids,
    [CAP] counts of entries per q (1..CAP), [MAX_LEVEL + 1] counts of level steps."""
    vocab = draft.config.vocab_size
    codec = QCodec(uniform_prior(vocab))  # the quantizer does not depend on the prior
    counts = np.zeros(vocab, dtype=np.int64)
    sizes = np.zeros(CAP, dtype=np.int64)
    steps = np.zeros(MAX_LEVEL + 1, dtype=np.int64)
    level = {w: i for i, w in enumerate(WEIGHTS)}
    files, _ = split(corpus_files())
    random.Random(seed).shuffle(files)
    params, seen = SamplingParams(temperature=0.8), 0
    for f in files:
        ids = tokenizer(f.read(), add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids) - seq, seq * 4):
            with torch.no_grad():
                probs = warp(draft(torch.tensor([ids[start:start + seq]])).logits[0], params)
            for row in probs:                                            # [vocab]
                q = codec.quantize(row, CAP)
                np.add.at(counts, q.ids, 1)
                sizes[len(q.ids) - 1] += 1
                np.add.at(steps, np.diff([level[int(w)] for w in q.weights]).astype(np.int64), 1)
            seen += seq
            if seen >= tokens:
                return counts, sizes, steps
    return counts, sizes, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", type=Path, default=ROOT / "models/tandem-draft")
    parser.add_argument("--tokens", type=int, default=200_000, help="positions to count over")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(args.draft))
    draft = AutoModelForCausalLM.from_pretrained(str(args.draft)).eval()
    counts, sizes, steps = count_kept_ids(draft, tokenizer, args.tokens)
    out = prior_path(tokenizer_fingerprint(tokenizer))
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, counts.astype(np.uint32))
    print(f"{out}: {int(counts.sum())} kept ids over {args.tokens} positions, "
          f"{int((counts > 0).sum())} distinct")
    print(f"COUNT_FREQS = {tuple(int(c) + 1 for c in sizes)}")
    print(f"STEP_FREQS = {tuple(int(c) + 1 for c in steps)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
