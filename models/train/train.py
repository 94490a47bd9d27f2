"""Train one member of the model family on the tokenised stdlib corpus.

    python -m models.train.train --role target --minutes 45
    python -m models.train.train --role draft --teacher models/tandem-target --minutes 25

The target learns from the corpus (next-token cross-entropy). The draft is distilled from the
target: its loss is the forward KL divergence to the target's next-token distribution plus a
small cross-entropy term, which is what raises acceptance (the draft learns to agree with the
target, not just with the data).

Checkpoints (model, optimiser, step, RNG state) are written to the cache every
`--checkpoint-every` steps and at the end; a rerun with the same arguments resumes from the last
one, so an interrupted run loses at most that many steps. The finished model is saved as a
Hugging Face directory with the tokenizer beside it.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from models.train import data
from models.train.presets import DISTILLED, PRESETS

log = logging.getLogger("tandem.train")


def batch_at(tokens: np.ndarray, rng: np.random.Generator, batch: int, seq: int) -> torch.Tensor:
    starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
    rows = np.stack([tokens[s : s + seq + 1].astype(np.int64) for s in starts])
    return torch.from_numpy(rows)  # [batch, seq + 1]


def lr_at(step: int, progress: float, peak: float, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 10% over the time budget.

    The schedule follows elapsed time (progress = elapsed / budget), not a step count, so a run
    ends on its budget whatever else the machine is doing, and a resumed run keeps its schedule.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@torch.no_grad()
def heldout_loss(model, tokens: np.ndarray, seq: int, batches: int = 16) -> float:
    model.eval()
    rng = np.random.default_rng(1234)
    losses = []
    for _ in range(batches):
        xy = batch_at(tokens, rng, 8, seq)
        logits = model(input_ids=xy[:, :-1]).logits
        losses.append(F.cross_entropy(logits.flatten(0, 1), xy[:, 1:].flatten()).item())
    model.train()
    return float(np.mean(losses))


def distill_loss(student_logits, teacher_logits, targets, ce_weight: float) -> torch.Tensor:
    # [batch, seq, vocab] each; forward KL(teacher || student) at temperature 1.
    t_logp = F.log_softmax(teacher_logits.float(), dim=-1)
    s_logp = F.log_softmax(student_logits.float(), dim=-1)
    kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()
    ce = F.cross_entropy(student_logits.flatten(0, 1), targets.flatten())
    return kl + ce_weight * ce


def init_from_layers(model, source_dir: Path, layers: list[int]) -> None:
    """Start `model` from another model of the same width: every non-layer weight as it is, and
    layer i from the source's layer layers[i] (a layer-dropped copy of the teacher starts far
    closer to it than random weights; DistilBERT's initialisation)."""
    source = AutoModelForCausalLM.from_pretrained(str(source_dir), dtype=torch.float32).state_dict()
    if len(layers) != model.config.num_hidden_layers:
        raise ValueError(f"--init-layers names {len(layers)} layers, the model has "
                         f"{model.config.num_hidden_layers}")
    state = {}
    for name in model.state_dict():
        if name.startswith("model.layers."):
            i = int(name.split(".")[2])
            name_in_source = name.replace(f"model.layers.{i}.", f"model.layers.{layers[i]}.", 1)
        else:
            name_in_source = name
        state[name] = source[name_in_source]
    model.load_state_dict(state)
    log.info("initialised from %s, layers %s", source_dir, layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=sorted(PRESETS), required=True)
    parser.add_argument("--tokenizer", type=Path, default=Path("models/tokenizer"))
    parser.add_argument("--teacher", type=Path, help="HF directory of the target (distilled roles)")
    parser.add_argument("--out", type=Path, help="default: models/<preset name>")
    parser.add_argument("--cache", type=Path, default=Path("models/.cache"))
    parser.add_argument("--minutes", type=float, default=45.0, help="wall-clock budget")
    parser.add_argument("--steps", type=int, default=1_000_000, help="upper bound on steps")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--ce-weight", type=float, default=0.1)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-from", type=Path, help="HF directory whose weights start the run "
                        "(same width): embeddings, final norm and the layers --init-layers names")
    parser.add_argument("--init-layers", type=lambda v: [int(i) for i in v.split(",")],
                        help="for each layer of the new model, the --init-from layer it copies, "
                             "e.g. 0,3,7 (first, middle, last: a layer-dropped teacher)")
    parser.add_argument("--save-dtype", choices=("float32", "float16"), default="float32",
                        help="dtype of the saved HF weights (float16 halves the file; every "
                             "loader and exporter upcasts to float32, exactly)")
    args = parser.parse_args()

    preset = PRESETS[args.role]
    out = args.out or Path("models") / preset.name
    args.cache.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s",
        handlers=[logging.FileHandler(args.cache / f"train-{args.role}.log"), logging.StreamHandler()],
    )
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    paths = data.prepare(args.tokenizer, args.cache)
    train_tokens, heldout_tokens = data.load(paths["train"]), data.load(paths["heldout"])

    model = LlamaForCausalLM(preset.llama_config(len(tokenizer), tokenizer.eos_token_id))
    teacher = None
    if args.role in DISTILLED:
        if args.teacher is None:
            parser.error(f"--teacher is required for the {args.role} (it is distilled from the target)")
        teacher = AutoModelForCausalLM.from_pretrained(str(args.teacher), dtype=torch.float32).eval()
    if args.init_from is not None:
        init_from_layers(model, args.init_from, args.init_layers or list(range(preset.num_layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    ckpt_path = args.cache / f"ckpt-{args.role}.pt"
    step, elapsed = 0, 0.0
    budget_s = args.minutes * 60
    rng = np.random.default_rng(args.seed)
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        step, elapsed = ckpt["step"], ckpt["elapsed"]
        rng.bit_generator.state = ckpt["rng"]
        torch.set_rng_state(ckpt["torch_rng"])
        log.info("resumed %s at step %d (%.0f of %.0f s)", args.role, step, elapsed, budget_s)

    n_params = sum(p.numel() for p in model.parameters())
    log.info("%s: %.2fM parameters, batch %dx%d", preset.name, n_params / 1e6, args.batch, args.seq)

    def save_checkpoint() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                    "elapsed": elapsed, "rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state()}, tmp)
        tmp.rename(ckpt_path)

    model.train()
    bar = tqdm(total=int(budget_s), initial=int(elapsed), desc=f"train {args.role}", unit="s")
    start = time.monotonic() - elapsed
    while elapsed < budget_s and step < args.steps:
        xy = batch_at(train_tokens, rng, args.batch, args.seq)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, elapsed / budget_s, args.lr, args.warmup)
        logits = model(input_ids=xy[:, :-1]).logits
        if teacher is None:
            loss = F.cross_entropy(logits.flatten(0, 1), xy[:, 1:].flatten())
        else:
            with torch.no_grad():
                teacher_logits = teacher(input_ids=xy[:, :-1]).logits
            loss = distill_loss(logits, teacher_logits, xy[:, 1:], args.ce_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        now = time.monotonic() - start
        bar.update(int(now) - int(elapsed))
        elapsed = now
        bar.set_postfix(step=step, loss=f"{loss.item():.3f}")
        if step % args.checkpoint_every == 0:
            save_checkpoint()
            log.info("step %d loss %.4f lr %.2e elapsed %.0fs", step, loss.item(),
                     optimizer.param_groups[0]["lr"], elapsed)
    bar.close()
    save_checkpoint()

    val = heldout_loss(model, heldout_tokens, args.seq)
    if args.save_dtype == "float16":
        model = model.half()
    model.config.dtype = args.save_dtype
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    summary = {"role": args.role, "name": preset.name, "parameters": n_params, "steps": step,
               "train_minutes": round(elapsed / 60, 1), "batch": args.batch, "seq": args.seq,
               "tokens_seen": step * args.batch * args.seq, "heldout_loss": round(val, 4),
               "heldout_ppl": round(math.exp(val), 2), "seed": args.seed,
               "save_dtype": args.save_dtype}
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info("done: %s", json.dumps(summary))


if __name__ == "__main__":
    main()
