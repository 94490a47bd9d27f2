"""Fit fast mode's shipped calibration prior (issue 30): models/fast-calibration.json.

    python -m models.train.fit_fast_prior [--prompts 106] [--max-tokens 64]

For each local model (tandem-draft, tandem-small) against tandem-target: on the held-out code
and prose prompts of the *fit* files only (tandem/prompts.py; fast mode is benchmarked on
the other files), both models step through a continuation written as fast mode writes it (the local
model's greedy token where it is confident, the target's where it is not), and at each position
count whether the target's greedy choice is the local model's. Counted per confidence bucket of the local model (edge/fast_calibration.py):
positions seen, and of them how many the target agreed with. The edge scales the counts to
`client.fast.prior_tokens` observations and lets its own checked tokens take over.
"""
from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from tandem.prompts import SOURCES, load_source
from edge.fast_calibration import CONFIDENCE_EDGES, bucket
from edge.tokenizer import EdgeTokenizer

OUT = Path("models/fast-calibration.json")
TARGET = Path("models/tandem-target")
LOCAL = (Path("models/tandem-draft"), Path("models/tandem-small"))
CONTEXT_TOKENS = 400  # the prompt's last tokens, as bench.fast_mode_bench sends them
FIT_CUT = 0.12        # below this confidence the fit's text takes the target's token: about
                      # the cut fast mode settles at for min_agreement 0.95 on these models


@torch.inference_mode()
def positions(local, target, prompt: Sequence[int], max_tokens: int) -> list[tuple[float, float, bool]]:
    """(confidence, entropy, target agrees) at each position of fast-mode-like text: the local
    model's greedy token where its confidence is at least FIT_CUT, else the target's (fast mode
    asks the target there, so the text stays where the target would take it; a purely local
    continuation drifts after its first miss and would make the prior pessimistic)."""
    ids = torch.tensor([list(prompt)])
    local_out = local(ids, use_cache=True)
    target_out = target(ids, use_cache=True)
    rows = []
    for _ in range(max_tokens):
        logp = torch.log_softmax(local_out.logits[0, -1].float(), dim=-1)
        confidence, mine = (float(v) for v in logp.exp().max(-1))
        entropy = float(-(logp.exp() * logp).nan_to_num().sum())
        theirs = int(target_out.logits[0, -1].argmax())
        rows.append((confidence, entropy, int(mine) == theirs))
        step = torch.tensor([[int(mine) if confidence >= FIT_CUT else theirs]])
        local_out = local(step, past_key_values=local_out.past_key_values, use_cache=True)
        target_out = target(step, past_key_values=target_out.past_key_values, use_cache=True)
    return rows


def counts(rows: Sequence[tuple[float, float, bool]]) -> dict[str, list[float]]:
    seen = [0.0] * (len(CONFIDENCE_EDGES) - 1)
    agreed = [0.0] * len(seen)
    for conf, _, agree in rows:
        b = bucket(conf)
        seen[b] += 1
        agreed[b] += float(agree)
    return {"seen": seen, "agreed": agreed}


def measure(local_dir: Path, prompts: Sequence[list[int]], max_tokens: int):
    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    local = AutoModelForCausalLM.from_pretrained(local_dir, dtype=torch.float32).eval()
    return [row for p in prompts for row in positions(local, target, p, max_tokens)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.train.fit_fast_prior",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=None,
                        help="fit prompts per source (default: all)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tokenizer = EdgeTokenizer(TARGET)
    texts = [t for source in SOURCES.values() for t in load_source(source, "fit", args.prompts)]
    prompts = [tokenizer.encode(t)[-CONTEXT_TOKENS:] for t in texts]
    models = {}
    for local_dir in LOCAL:
        rows = measure(local_dir, prompts, args.max_tokens)
        models[local_dir.name] = counts(rows)
        print(f"{local_dir.name}: {len(rows)} positions, agreement "
              f"{sum(r[2] for r in rows) / len(rows):.3f}")
    # one line per list: the file stays small and diffs read per model
    body = {"target": TARGET.name, "edges": list(CONFIDENCE_EDGES), "models": models,
            "fitted_on": f"{len(prompts)} fit-split prompts, code and prose (tandem/prompts.py) x "
                         f"{args.max_tokens} tokens, the target's below confidence {FIT_CUT}"}
    text = json.dumps(body, indent=1)
    args.out.write_text(re.sub(r"\[[^\[\]{}]*\]", lambda m: " ".join(m.group(0).split()), text)
                        + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
