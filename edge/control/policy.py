"""The draft policy interface: asked once per round what to do, told what happened.

The shape is transformers' CandidateGenerator (`get_candidates` / `update_candidate_strategy`):
`plan(view) -> Plan` before a round, `update(record)` after it. The round loop (edge/generation.py)
applies the caps a policy cannot break (remaining tokens, the server's limits, the context) by
giving it `view.max_k` and clamping the answer; everything else is the policy's choice.

One policy object lives per EdgeClient and sees every generation of that client in turn, so
what it learned (acceptance, the link) carries over as a prior; `view.round == 0` marks the
first round of a generation. Policies are built by name from `client.policy` through the
registry below; other modules add theirs with `@register_policy("name")`.

Every policy subclasses DraftPolicy, which declares the capabilities the loop asks of it with
their defaults (prefill_first, serves_fast_mode): nothing is looked up by name.

Contract notes (differences from the sketch in coord/TEAM.md, all additive): RoundView carries
a few more read-only facts with defaults (context_length, max_q_entries, max_send_ahead,
drafters, server_load, price, min_tokens_per_s); Plan is unchanged.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from edge.link_state import LinkState
from edge.record import RoundRecord

if TYPE_CHECKING:
    from edge.config import ClientConfig

# What a committed token costs the verifier's passes, ms: (speculative rounds, cloud runs), as
# it measured them (Verdict.speculate_token_ms, cloud_token_ms); None where it has not.
TokenMs = tuple[float | None, float | None]


@dataclass(frozen=True)
class RoundView:
    """What a policy may look at before a round."""
    round: int                      # rounds already in this generation's log
    generated: int                  # tokens committed so far
    remaining: int                  # tokens still allowed (max_tokens - generated), >= 1
    max_k: int                      # most tokens this round may draft (all caps applied)
    link_state: LinkState           # DOWN while the generation goes on locally
    sampling: bool                  # False = greedy
    history: Sequence[RoundRecord]  # this generation's rounds so far (read-only)
    context_length: int = 0
    max_q_entries: int = 0          # the most sparse-q entries the verifier takes (sampling)
    max_send_ahead: int = 1         # the most blocks the verifier lets be in flight
    drafters: tuple[str, ...] = ()  # local models available ("" = the default one)
    server_load: float = 0.0        # the verifier's share of its session budget in use, 0..1
    fast: bool = False              # the request is in fast mode: skippable blocks go unverified
    price: float = 0.0              # the verifier's price, 0..1, as its last reply said (0 from
                                    # one that does not price its passes: cloud/price.py)
    position_cost: float | None = None  # what a drafted position costs the verifier in 1-token
                                        # steps, as it measured (Opened); None: not said
    token_ms: TokenMs = (None, None)  # what a committed token costs it per mode, as measured
    min_tokens_per_s: float | None = None  # the request's speed floor; None = the client's


@dataclass(frozen=True)
class Plan:
    k: int                          # most tokens to draft this round (0 allowed)
    min_confidence: float = 0.0     # stop the block when the draft's top prob falls below
    drafter: str | None = None      # which local model drafts (None = default)
    verify: bool = True             # False = commit unverified (fast mode / local)
    q_entries: int | None = None    # sparse-q entries per position (sampling); None = config
    send_ahead: int = 1             # blocks allowed in flight (edge/rounds/pipelined.py)
    draft_ahead: bool = False       # draft the next block while this one is being verified
    cloud_generate: int = 0         # > 0: ask the verifier to generate n tokens itself
    # Fast mode: the draft length of the verified round the loop forces after an unsure
    # position (or a full unverified run); None = k. 0 asks the target for just that one
    # token, so the cloud is spent only where the draft is unsure.
    unsure_k: int | None = None

    def __post_init__(self) -> None:
        if self.k < 0 or self.send_ahead < 1 or self.cloud_generate < 0 or \
                (self.unsure_k is not None and self.unsure_k < 0):
            raise ValueError(f"invalid plan {self}")


class DraftPolicy(ABC):
    """What every draft policy is: `plan(view)` before a round, `update(record)` after it, and
    the capabilities the loop and the client ask of it, declared here with their defaults (a
    policy overrides those it has, as a class attribute or a property):

      prefill_first     the loop prefills the draft on the prompt before the first round;
                        False defers it to the first block (a policy that starts by letting the
                        cloud generate may never draft: edge/control/adaptive.py)
      serves_fast_mode  its plans mark skippable blocks (Plan.verify False), so EdgeClient
                        runs fast requests with it (else with its own entropy switch)
    """
    prefill_first: bool = True
    serves_fast_mode: bool = False

    @abstractmethod
    def plan(self, view: RoundView) -> Plan: ...

    @abstractmethod
    def update(self, record: RoundRecord) -> None: ...


class FixedK(DraftPolicy):
    """Draft k tokens every round (capped by view.max_k): the behaviour before policies.
    Optionally pipelined: draft ahead, and up to send_ahead blocks in flight."""

    def __init__(self, k: int, *, draft_ahead: bool = False, send_ahead: int = 1) -> None:
        if k < 0 or send_ahead < 1:
            raise ValueError(f"k must be >= 0 and send_ahead >= 1, got {k}, {send_ahead}")
        self.k = k
        self.draft_ahead = draft_ahead
        self.send_ahead = send_ahead

    def plan(self, view: RoundView) -> Plan:
        return Plan(k=min(self.k, view.max_k), draft_ahead=self.draft_ahead,
                    send_ahead=self.send_ahead)

    def update(self, record: RoundRecord) -> None:
        pass


PolicyFactory = Callable[["ClientConfig"], DraftPolicy]
_REGISTRY: dict[str, PolicyFactory] = {}


def register_policy(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Decorator: `factory(client_config) -> DraftPolicy` becomes `client.policy: name`."""
    def add(factory: PolicyFactory) -> PolicyFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"policy {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory
    return add


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def make_policy(name: str, config: "ClientConfig") -> DraftPolicy:
    _load_builtin()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown draft policy {name!r}; known: {', '.join(sorted(_REGISTRY))}") \
            from None
    return factory(config)


@register_policy("fixed")
def _fixed(config: "ClientConfig") -> DraftPolicy:
    return FixedK(config.draft_length, draft_ahead=config.draft_ahead,
                  send_ahead=config.send_ahead)


def _load_builtin() -> None:
    """Import the modules that register the other built-in policies (lazily: no import cycle)."""
    import importlib
    for module in ("edge.control.adaptive", "edge.control.peers", "edge.control.entropy"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:  # a real import error inside an existing module
                raise
