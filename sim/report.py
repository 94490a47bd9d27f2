"""Summaries of workload runs: the per-profile table, the JSON file and the PNG plots.

Metric conventions (shared/ANCHORS.md): verified tokens/s is the mean of per-request verified
tokens / request wall time (client side), local tokens/s the same for tokens the target did not
check; the two are never added into one speed. TTFT is request sent -> first text chunk; mean
accepted length tau = 1 + accepted / rounds over all rounds of the run; target passes per token
and bytes (up + down, protobuf payloads) per token are totals over all emitted tokens; verified
share = tokens the target checked / all emitted tokens.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sim.workload import RequestRecord
from sim.writers import plot_session_trace, pyplot, save_figure, text_table
from sim.writers import write_json as write_json_file
from tandem import metrics


@dataclass(frozen=True)
class RunSummary:
    name: str
    requests: int
    errors: int
    tokens: int
    wall_s: float                  # the whole run, first request sent -> last answered
    verified_tokens_per_s: float   # mean over requests
    local_tokens_per_s: float      # mean over requests (unverified: the draft's alone)
    verified_throughput_tok_s: float  # all verified tokens / wall_s
    local_throughput_tok_s: float     # all local tokens / wall_s
    ttft_ms: float | None          # mean over requests
    mean_accepted_length: float    # tau
    target_passes_per_token: float
    bytes_per_token: float
    verified_share: float
    reopens: int


def run_summary(name: str, records: Sequence[RequestRecord], wall_s: float) -> RunSummary:
    ok = [r for r in records if r.ok]
    stats = [r.tandem for r in ok if r.tandem]
    tokens = sum(r.completion_tokens for r in ok)
    rounds = sum(s["rounds"] for s in stats)
    accepted = sum(sum(s["accepted_lengths"]) for s in stats)
    verified = sum(s["verified_tokens"] for s in stats)
    emitted = verified + sum(s["unverified_tokens"] for s in stats)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    return RunSummary(
        name=name, requests=len(records), errors=len(records) - len(ok), tokens=tokens, wall_s=wall_s,
        verified_tokens_per_s=statistics.fmean(r.verified_tokens_per_s for r in ok) if ok else 0.0,
        local_tokens_per_s=statistics.fmean(r.local_tokens_per_s for r in ok) if ok else 0.0,
        verified_throughput_tok_s=verified / wall_s if wall_s > 0 else 0.0,
        local_throughput_tok_s=(emitted - verified) / wall_s if wall_s > 0 else 0.0,
        ttft_ms=statistics.fmean(ttfts) * 1000.0 if ttfts else None,
        mean_accepted_length=metrics.tau(accepted, rounds),
        target_passes_per_token=metrics.passes_per_token(sum(s["target_passes"] for s in stats),
                                                         tokens),
        bytes_per_token=sum(s["bytes_up"] + s["bytes_down"] for s in stats) / tokens if tokens else 0.0,
        verified_share=verified / emitted if emitted else 0.0,
        reopens=sum(s["reopens"] for s in stats))


COLUMNS = [  # header, RunSummary field, format
    ("profile", "name", "{}"),
    ("verified tok/s", "verified_tokens_per_s", "{:.1f}"),
    ("local tok/s", "local_tokens_per_s", "{:.1f}"),
    ("TTFT ms", "ttft_ms", "{:.0f}"),
    ("tau", "mean_accepted_length", "{:.2f}"),
    ("passes/tok", "target_passes_per_token", "{:.3f}"),
    ("bytes/tok", "bytes_per_token", "{:.1f}"),
    ("verified", "verified_share", "{:.1%}"),
    ("req", "requests", "{}"),
    ("errors", "errors", "{}"),
    ("reopens", "reopens", "{}"),
]


def format_table(summaries: Sequence[RunSummary]) -> str:
    return text_table([(header, _cell(name, fmt)) for header, name, fmt in COLUMNS], summaries)


def _cell(name: str, fmt: str):
    def cell(summary: RunSummary) -> str:
        value = getattr(summary, name)
        return "-" if value is None else fmt.format(value)
    return cell


def write_json(path: Path, summaries: Sequence[RunSummary], records: dict[str, Sequence[RequestRecord]],
               extra: dict) -> None:
    write_json_file(path, {**extra,
                           "summaries": {s.name: asdict(s) for s in summaries},
                           "requests": {name: [_record_dict(r) for r in rs]
                                        for name, rs in records.items()}})


def _record_dict(record: RequestRecord) -> dict:
    out = asdict(record)
    out["verified_tokens_per_s"] = record.verified_tokens_per_s
    out["local_tokens_per_s"] = record.local_tokens_per_s
    return out


def session_trace(records: Sequence[RequestRecord]) -> list[dict]:
    """The per-round trace of the request with the most rounds (the most informative session)."""
    traced = [r for r in records if r.ok and r.tandem.get("trace")]
    if not traced:
        return []
    return max(traced, key=lambda r: len(r.tandem["trace"])).tandem["trace"]


def write_plots(out_dir: Path, summaries: Sequence[RunSummary], trace: list[dict],
                trace_name: str) -> list[Path]:
    """tokens_per_s.png (verified and local tokens/s side by side per profile) and session_trace.png (draft length and RTT per round
    of one session over time)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [s.name for s in summaries]
    x = list(range(len(names)))
    width = 0.4
    bars = ax.bar([i - width / 2 for i in x], [s.verified_tokens_per_s for s in summaries], width,
                  color="#3a7dc9", label="verified (the target's output)")
    ax.bar([i + width / 2 for i in x], [s.local_tokens_per_s for s in summaries], width,
           color="#d9822b", label="local (unverified, the draft's alone)")
    for bar, summary in zip(bars, summaries):
        ax.annotate(f"{summary.verified_tokens_per_s:.1f}\n{summary.verified_share:.0%} verified",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, names)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_ylabel("tokens/s per request (mean)")
    ax.set_title("Tandem: generation speed per channel profile")
    ax.margins(y=0.25)
    written = [save_figure(fig, out_dir / "tokens_per_s.png")]
    verified = [r for r in trace if r.get("mode", "verify") == "verify"]
    server = [r.get("server_ms") for r in trace]
    written.append(plot_session_trace(
        out_dir / "session_trace.png", f"one session over the {trace_name} profile",
        [r["t_s"] for r in trace], [r["draft_length"] for r in trace],
        [(r["t_s"], r["accepted"]) for r in verified], [r["rtt_ms"] for r in trace],
        [v if v is not None else float("nan") for v in server]
        if any(v is not None for v in server) else None, "of it: verifier",
        [(r["t_s"], r["tokens"]) for r in trace if r.get("mode") == "cloud"]))
    return written
