"""Numbers for the model card: held-out loss/perplexity of each model and the draft's greedy
acceptance against the target on held-out code.

    python -m models.train.evaluate [--target DIR] [--draft DIR] [--json PATH]

- single-token agreement: over held-out token positions (teacher forcing on the held-out files),
  the share where argmax(draft) == argmax(target). This is the per-token greedy acceptance rate.
- mean accepted length τ at k: greedy speculative decoding of held-out prompts (64 new tokens
  each); per round the draft proposes k greedy tokens, the target accepts the longest matching
  prefix and adds its own token; τ = tokens per round = 1 + accepted / rounds.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from models.train import data
from tandem import metrics


@torch.no_grad()
def teacher_forced(target, draft, tokens: np.ndarray, seq: int, windows: int) -> dict:
    """Held-out loss of both models and argmax agreement, over `windows` disjoint windows."""
    stride = max(seq, (len(tokens) - seq - 1) // windows)
    t_loss, d_loss, agree, n = 0.0, 0.0, 0, 0
    for start in tqdm(range(0, stride * windows, stride), desc="held-out windows"):
        x = torch.from_numpy(tokens[start : start + seq + 1].astype(np.int64))[None]
        t_logits = target(input_ids=x[:, :-1]).logits[0]  # [seq, vocab]
        d_logits = draft(input_ids=x[:, :-1]).logits[0]   # [seq, vocab]
        t_loss += F.cross_entropy(t_logits, x[0, 1:], reduction="sum").item()
        d_loss += F.cross_entropy(d_logits, x[0, 1:], reduction="sum").item()
        agree += (t_logits.argmax(-1) == d_logits.argmax(-1)).sum().item()
        n += seq
    return {"target_heldout_loss": t_loss / n, "draft_heldout_loss": d_loss / n,
            "target_heldout_ppl": math.exp(t_loss / n), "draft_heldout_ppl": math.exp(d_loss / n),
            "single_token_agreement": agree / n, "positions": n}


@torch.no_grad()
def greedy_continuation(model, ids: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         pad_token_id=0)
    return out[0, len(ids):].tolist()


def mean_accepted_length(draft, prompts: list[list[int]], references: list[list[int]], k: int) -> dict:
    """Greedy speculative decoding replayed against the target's own greedy continuations
    (`references`, one per prompt): what the verifier would accept round by round."""
    records: list[metrics.Round] = []
    for ids, reference in tqdm(list(zip(prompts, references)), desc=f"acceptance k={k}"):
        new_tokens = len(reference)
        pos = 0
        while pos < new_tokens:
            kk = min(k, new_tokens - pos - 1)
            proposal = greedy_continuation(draft, ids + reference[:pos], kk) if kk else []
            n = 0
            while n < kk and proposal[n] == reference[pos + n]:
                n += 1
            records.append(metrics.Round(drafted=kk, accepted=n))
            pos += n + 1
    accepted = sum(r.accepted for r in records)
    # per_position_rate: acceptance at position i given every earlier position was accepted.
    return {"k": k, "rounds": len(records), "tau": metrics.tau(accepted, len(records)),
            "acceptance_rate": metrics.acceptance_rate(accepted, sum(r.drafted for r in records)),
            "per_position_rate": [round(a, 3) for a in metrics.conditional_acceptance(records)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=Path("models/tandem-target"))
    parser.add_argument("--draft", type=Path, default=Path("models/tandem-draft"))
    parser.add_argument("--cache", type=Path, default=Path("models/.cache"))
    parser.add_argument("--prompts", type=Path, default=Path("models/prompts/heldout.jsonl"))
    parser.add_argument("--num-prompts", type=int, default=50)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--windows", type=int, default=64)
    parser.add_argument("--json", type=Path, default=Path("models/evaluation.json"))
    args = parser.parse_args()
    torch.set_num_threads(2)

    tokenizer = AutoTokenizer.from_pretrained(str(args.target))
    target = AutoModelForCausalLM.from_pretrained(str(args.target), dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(str(args.draft), dtype=torch.float32).eval()
    heldout = data.load(data.prepare(args.target, args.cache)["heldout"])

    report = teacher_forced(target, draft, heldout, seq=256, windows=args.windows)
    lines = args.prompts.read_text().splitlines()[: args.num_prompts]
    prompts = [tokenizer(json.loads(line)["prompt"], add_special_tokens=False)["input_ids"] for line in lines]
    references = [greedy_continuation(target, ids, args.new_tokens)
                  for ids in tqdm(prompts, desc="target greedy")]
    report["speculative"] = [mean_accepted_length(draft, prompts, references, k) for k in (4, 8)]
    report["num_prompts"], report["new_tokens"] = len(prompts), args.new_tokens
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
