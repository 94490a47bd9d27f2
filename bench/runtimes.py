"""Micro-benchmark of the model runtimes: tokens/s of each draft backend and of the target.

    tandem runtime-bench [--dev] [--json PATH] [--threads N] [--prefill-tokens 256] ...

Single stream. Prefill = one extend of a --prefill-tokens held-out prompt from an empty cache;
decode = --decode-tokens single-token extends after it (the text's own next tokens, so every
backend computes the same thing). Each number is the median over --repeats runs, after one
untimed warm-up run. The target is the HF model itself (AutoModelForCausalLM + DynamicCache),
as a baseline for what one target step costs on this machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenizers import Tokenizer
from transformers.utils import logging as hf_logging

from edge.runtime import DraftConfig, DraftRuntime, MissingBackend, load_draft_runtime

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = {"draft": ROOT / "models/tandem-draft", "small": ROOT / "models/tandem-small",
           "target": ROOT / "models/tandem-target"}
DEV = {"draft": ROOT / "models/.cache/dev-draft", "target": ROOT / "models/.cache/dev-target"}
GGUF_NAME, ONNX_NAME = "{model}-f32.gguf", "{model}.onnx"  # in the model's HF directory


@dataclass(frozen=True)
class SpeedRow:
    runtime: str
    model: str
    prefill_tokens: int
    decode_tokens: int
    prefill_tok_s: float       # median over repeats
    decode_tok_s: float        # median over repeats
    decode_ms_per_token: float


def benchmark_text_ids(tokenizer_dir: Path, n_tokens: int) -> list[int]:
    """n_tokens of held-out stdlib source (models/heldout_files.txt), concatenated in list order."""
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    ids: list[int] = []
    for name in (ROOT / "models/heldout_files.txt").read_text().split():
        if (stdlib / name).is_file():
            ids += tokenizer.encode((stdlib / name).read_text()).ids
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
    raise ValueError(f"held-out files give only {len(ids)} tokens, {n_tokens} wanted")


def time_one_run(runtime: DraftRuntime, prompt: list[int], continuation: list[int]) -> tuple[float, float]:
    """Seconds for the prefill of `prompt` and for decoding `continuation` one token at a time."""
    runtime.rollback(0)
    start = time.perf_counter()
    runtime.extend(prompt)
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    for token in continuation:
        runtime.extend([token])
    return prefill_s, time.perf_counter() - start


def measure(label: str, model: Path, runtime: DraftRuntime, ids: list[int], n_prefill: int,
            repeats: int) -> SpeedRow:
    prompt, continuation = ids[:n_prefill], ids[n_prefill:]
    time_one_run(runtime, prompt[:8], continuation[:2])  # warm-up: allocations, lazy graph init
    runs = [time_one_run(runtime, prompt, continuation) for _ in range(repeats)]
    prefill_s = statistics.median(r[0] for r in runs)
    decode_s = statistics.median(r[1] for r in runs)
    return SpeedRow(runtime=label, model=str(model), prefill_tokens=len(prompt),
                    decode_tokens=len(continuation), prefill_tok_s=len(prompt) / prefill_s,
                    decode_tok_s=len(continuation) / decode_s,
                    decode_ms_per_token=1e3 * decode_s / len(continuation))


def format_table(rows: list[SpeedRow]) -> str:
    lines = [f"{'runtime':<16}{'prefill tok/s':>15}{'decode tok/s':>15}{'decode ms/tok':>15}"]
    lines += [f"{r.runtime:<16}{r.prefill_tok_s:>15.0f}{r.decode_tok_s:>15.0f}{r.decode_ms_per_token:>15.3f}"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tandem runtime-bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dev", action="store_true", help="use the randomly initialised dev copies in models/.cache")
    parser.add_argument("--draft", type=Path, help="draft HF directory (default: models/tandem-draft)")
    parser.add_argument("--gguf", type=Path, help=f"draft GGUF (default: DRAFT/{GGUF_NAME})")
    parser.add_argument("--onnx", type=Path, help=f"draft ONNX (default: DRAFT/{ONNX_NAME})")
    parser.add_argument("--small", type=Path, help="the ladder's small model, HF directory with its "
                                                   "GGUF and ONNX beside it (default: "
                                                   "models/tandem-small when it exists)")
    parser.add_argument("--target", type=Path, help="target HF directory (default: models/tandem-target)")
    parser.add_argument("--prefill-tokens", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=DraftConfig.model_fields["threads"].default,
                        help="CPU threads per runtime (default: the edge config's default)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    hf_logging.disable_progress_bar()  # "Loading weights" bars would interleave with the table

    family = DEV if args.dev else SHIPPED
    draft = args.draft or family["draft"]
    target = args.target or family["target"]
    if args.prefill_tokens < 8 or args.decode_tokens < 2 or args.repeats < 1:
        parser.error("need --prefill-tokens >= 8, --decode-tokens >= 2, --repeats >= 1")
    n_ctx = args.prefill_tokens + args.decode_tokens
    ids = benchmark_text_ids(draft, n_ctx)
    cases: list[tuple[str, Path, Callable[[], DraftRuntime]]] = []
    runs = [("llama.cpp", "llama.cpp", args.gguf or draft / GGUF_NAME.format(model=draft.name)),
            ("onnxruntime", "onnxruntime", args.onnx or draft / ONNX_NAME.format(model=draft.name)),
            ("torch", "torch", draft)]
    small = args.small or family.get("small")
    if small is not None and (small / "config.json").exists():
        runs += [(f"small {label}", backend, path) for label, backend, path in (
            ("llama.cpp", "llama.cpp", small / GGUF_NAME.format(model=small.name)),
            ("onnxruntime", "onnxruntime", small / ONNX_NAME.format(model=small.name)),
            ("torch", "torch", small))]
    for label, backend, path in runs + [("target (torch)", "torch", target)]:
        config = DraftConfig(backend=backend, model_path=path, tokenizer_dir=draft, n_ctx=n_ctx, threads=args.threads)
        cases.append((label, path, lambda config=config: load_draft_runtime(config)))

    rows: list[SpeedRow] = []
    for label, path, load in cases:
        try:
            runtime = load()
        except MissingBackend as exc:
            print(f"{label}: skipped ({exc})")
            continue
        try:
            rows.append(measure(label, path, runtime, ids, args.prefill_tokens, args.repeats))
        finally:
            runtime.close()

    print(f"single stream, {args.prefill_tokens}-token prefill, {args.decode_tokens} decode steps, "
          f"median of {args.repeats}, {args.threads} threads")
    print(format_table(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()},
                                         "rows": [asdict(r) for r in rows]}, indent=2))


if __name__ == "__main__":
    main()
