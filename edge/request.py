"""The one request record of a generation, from whoever asks to the round loop: the daemon
builds it once from the HTTP request (edge/daemon/jobs.py), the CLI and the benchmarks build it
directly. It checks its own values when built; `resolved` fills the options it leaves to the
client from the client's config, the one place those defaults are read; the policy's RoundView
reads the request from there (edge/state.py)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from edge.config import ClientConfig
from edge.link.offline import OfflineMode
from tandem.sampling import SamplingParams


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    draft_length: int | None = None  # a fixed k for this request; None = the client's policy
    # Generation stops right after emitting one of these (the stop id is part of the output).
    # Callers pass their tokenizer's eos (edge.tokenizer.EdgeTokenizer.stop_ids); empty = none.
    stop_ids: frozenset[int] = frozenset()
    # "lossless": every token verified; "fast": the policy may let the edge emit low-entropy
    # spans unverified (edge/control/entropy.py). None = client.mode.
    mode: str | None = None
    max_unverified_run: int | None = None  # fast mode's bound; None = client.max_unverified_run
    # fast mode: the expected share of emitted tokens the target would itself choose
    # (edge/fast_mode.py); None = client.fast.min_agreement
    min_agreement: float | None = None
    # While the verifier is away: "continue" | "wait" | "require_verified" (edge/link/
    # offline.py); None = client.offline. offline_wait_s: None = client.offline_wait_s.
    offline: str | None = None
    offline_wait_s: float | None = None
    # The speed this request needs (tokens/s): under a priced verifier's load the adaptive
    # controller spends fewer passes per token only while it keeps to it. None = the client's
    # client.min_tokens_per_s.
    min_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        """The one place a request's own values are checked, whoever builds it (the daemon,
        the CLI, a benchmark)."""
        for problem in _problems(self):
            raise ValueError(problem)

    def resolved(self, config: ClientConfig) -> GenerationRequest:
        """This request with every option it left to the client (None) filled from `config`:
        the one place those defaults are read."""
        return replace(self, **{name: default(config) for name, default in OPTION_DEFAULTS.items()
                                if getattr(self, name) is None})


MODES = ("lossless", "fast")
OFFLINE_MODES = tuple(mode.value for mode in OfflineMode)
# The request's options that default to the client's config (None = the config's). The daemon's
# HTTP schema carries them, and draft_length (None = the policy's), under the same names.
OPTION_DEFAULTS = {
    "mode": lambda config: config.mode,
    "max_unverified_run": lambda config: config.max_unverified_run,
    "min_agreement": lambda config: config.fast.min_agreement,
    "offline": lambda config: config.offline,
    "offline_wait_s": lambda config: config.offline_wait_s,
    "min_tokens_per_s": lambda config: config.min_tokens_per_s,
}
OPTIONS = ("draft_length", *OPTION_DEFAULTS)


def _problems(request: GenerationRequest) -> list[str]:
    checks = [
        (not request.prompt_ids, "the prompt must hold at least one token"),
        (request.max_tokens < 1, f"max_tokens must be >= 1, got {request.max_tokens}"),
        (request.draft_length is not None and request.draft_length < 0,
         f"draft_length must be >= 0, got {request.draft_length}"),
        (request.mode is not None and request.mode not in MODES,
         f"mode must be one of {MODES}, got {request.mode!r}"),
        (request.max_unverified_run is not None and request.max_unverified_run < 0,
         f"max_unverified_run must be >= 0, got {request.max_unverified_run}"),
        (request.min_tokens_per_s is not None and not request.min_tokens_per_s >= 0,
         f"min_tokens_per_s must be >= 0, got {request.min_tokens_per_s}"),
        (request.min_agreement is not None and not 0 < request.min_agreement <= 1,
         f"min_agreement must be in (0, 1], got {request.min_agreement}"),
        (request.offline is not None and request.offline not in OFFLINE_MODES,
         f"offline must be one of {OFFLINE_MODES}, got {request.offline!r}"),
    ]
    return [message for failed, message in checks if failed]
