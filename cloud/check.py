"""tandem-cloud check MODEL_DIR: what a user runs before serving their own model.

Loads the model as `serve` would (same device, dtype and serving path), says which path serves
it (the batched slot pool, the exact path, or refused and why), runs the exactness self-test
on that path (seeded random contexts past the widest attention window; a ragged batched pass
against the model's own forward: max logit difference, argmax agreement), and prints the KV
bytes per token and the largest context. Exit 0 when the model would be served exactly, 1
when it would not (refused, or the chosen path fails its self-test), 2 on bad arguments.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

EXIT_EXACT, EXIT_NOT_EXACT = 0, 1


def check_model(model_dir: Path, device: str, dtype: str, serving_path: str) -> dict:
    """The report as a dict: path, reason, self_test, kv_bytes_per_token, max_context,
    family, exact (bool). Refusals come back as a report too (exact False, path "refused")."""
    from cloud.runtime.serving_path import EXACT, UnsupportedTarget, run_self_test, \
        self_test_lengths
    from cloud.runtime.target import DTYPES, TargetRuntime

    try:
        runtime = TargetRuntime(model_dir, device=device, dtype=dtype, serving_path=serving_path)
    except UnsupportedTarget as error:
        return {"model": str(model_dir), "family": error.family, "path": "refused",
                "reason": str(error), "self_test": None, "exact": False}
    test = runtime.path.self_test
    if runtime.path.name == EXACT:  # the slot pool's test (if any) says why not; test this one
        test = run_self_test(runtime.new_state, lambda batch: list(runtime.forward(batch)),
                             runtime.reference_logits, runtime.vocab_size,
                             self_test_lengths(runtime.model.config, runtime.max_context),
                             DTYPES[dtype])
    return {"model": str(model_dir), "family": runtime.family, "device": str(runtime.device),
            "dtype": dtype, "path": runtime.path.name, "reason": runtime.path.reason,
            "self_test": {**asdict(test), "passed": test.passed},
            "kv_bytes_per_token": runtime.bytes_per_token, "max_context": runtime.max_context,
            "exact": test.passed}


def format_report(report: dict) -> str:
    lines = [f"model      {report['model']} (family {report['family']})"]
    if report["path"] == "refused":
        lines.append(f"path       refused: {report['reason']}")
    else:
        lines.append(f"path       {report['path']} on {report['device']} {report['dtype']}: "
                     f"{report['reason']}")
        test = report["self_test"]
        if test["error"]:
            lines.append(f"self-test  raised {test['error']}")
        else:
            lines.append(f"self-test  contexts {test['contexts']} tokens, {test['rows']} rows: "
                         f"max logit diff {test['max_logit_diff']:.3g} (tolerance "
                         f"{test['tolerance']:.3g}), argmax agreement "
                         f"{100 * test['argmax_agreement']:.1f}%")
        lines.append(f"kv         {report['kv_bytes_per_token']} bytes per token, largest "
                     f"context {report['max_context']}")
    lines.append("verdict    " + ("served exactly" if report["exact"] else
                                  "NOT served exactly by the torch backend"))
    return "\n".join(lines)


def run_check(args) -> int:
    """The CLI verb (cloud/cli.py parses): prints the report (or JSON), returns the exit code."""
    from transformers.utils import logging as transformers_logging
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    if not (Path(args.model_dir) / "config.json").is_file():
        print(f"tandem-cloud check: {args.model_dir}: not an HF model directory (no config.json)",
              file=sys.stderr)
        return 2
    report = check_model(Path(args.model_dir), args.device, args.dtype, args.serving_path)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return EXIT_EXACT if report["exact"] else EXIT_NOT_EXACT
