"""Greedy identity of the verifier's batched path on a device: held-out prompts decoded greedily
through TargetRuntime.forward (every prompt a session, all of them in each pass: the packed,
slot-attention path the verifier runs) against transformers' own greedy generate of the same
model on the same device and dtype. The tokens must be identical.

  python -m bench.passcost.identity [--device auto] [--prompts 16] [--tokens 32] [--json P]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tandem.config import REPO_ROOT
from sim.writers import write_json

PROMPTS = REPO_ROOT / "models/prompts/heldout.jsonl"
PROMPT_OFFSET = 32   # past the decided bench's and the capacity run's prompts
MAX_PROMPT = 256


def batched_greedy(runtime, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """Every prompt a session; one pass feeds all prompts, then one pass per step feeds every
    session its last token."""
    states = [runtime.new_state() for _ in prompts]
    try:
        logits = runtime.forward(list(zip(states, prompts)))
        out = [[int(logits[i][-1].argmax())] for i in range(len(prompts))]
        for _ in range(tokens - 1):
            logits = runtime.forward([(s, [o[-1]]) for s, o in zip(states, out)])
            for i, o in enumerate(out):
                o.append(int(logits[i][-1].argmax()))
        return out
    finally:
        for state in states:
            state.release()


def reference_greedy(model_dir: Path, device, dtype: str, prompts, tokens: int):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from cloud.runtime.target import DTYPES

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype],
                                                 local_files_only=True).to(device).eval()
    config = GenerationConfig(do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                              eos_token_id=None, pad_token_id=0)
    out = []
    with torch.inference_mode():
        for ids in prompts:
            generated = model.generate(torch.tensor([ids], device=device),
                                       generation_config=config)
            out.append(generated[0, len(ids):].tolist())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.passcost.identity",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=REPO_ROOT / "models/tandem-target")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from cloud.runtime.target import TargetRuntime

    runtime = TargetRuntime(args.model, device=args.device, dtype=args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    lines = PROMPTS.read_text().splitlines()[PROMPT_OFFSET: PROMPT_OFFSET + args.prompts]
    prompts = [tokenizer(json.loads(line)["prompt"])["input_ids"][-MAX_PROMPT:] for line in lines]
    got = batched_greedy(runtime, prompts, args.tokens)
    want = reference_greedy(args.model, runtime.device, args.dtype, prompts, args.tokens)
    same = [g == w for g, w in zip(got, want)]
    first = [next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), None)
             for g, w in zip(got, want)]
    result = {"device": str(runtime.device), "dtype": args.dtype, "prompts": len(prompts),
              "tokens": args.tokens, "identical": sum(same), "first_difference": first}
    print(f"greedy identity on {runtime.device} ({args.dtype}): {sum(same)}/{len(prompts)} "
          f"held-out prompts x {args.tokens} tokens identical to transformers' generate")
    if args.json:
        write_json(args.json, result, indent=1)
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
