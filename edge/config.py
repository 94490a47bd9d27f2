"""Typed configuration of the edge: how to reach the verifier (`cloud`), which draft model runs
(`draft`), how a session behaves (`client`) and the local HTTP daemon (`daemon`).

configs/edge.yaml validates into `EdgeConfig`; every knob has its default, bounds and description
here and nowhere else (the CLI only overrides fields of these classes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from edge.runtime.config import DraftConfig
from tandem.codec_defaults import DEFAULT_CODED_ENTRIES, DEFAULT_MAX_ENTRIES, DEFAULT_SCALE
from tandem.config import Settings, resolve_path

DEFAULT_API_KEY_HEADER = "x-api-key"


class CloudLinkConfig(Settings):
    """Where the verifier is and how to authenticate to it."""
    address: str = Field("127.0.0.1:50051", min_length=1, description=(
        "the verifier: any gRPC target: HOST:PORT, several as ipv4:H1:P1,H2:P2, or "
        "dns:///NAME:PORT (every address the name resolves to); a proxy's HOST:PORT"))
    load_balancing: Literal["auto", "pick_first", "round_robin", "ring_hash"] = Field(
        "auto", description=(
            "gRPC's own policy over the verifiers `address` names: round_robin spreads sessions "
            "over all of them; ring_hash hashes each session's id (call metadata "
            "x-tandem-session), so its re-opens go back to its verifier while that one is up "
            "(affinity: its prefix cache stays warm) and to the next one when it is not; "
            "pick_first uses the first that answers; auto = round_robin when `address` names "
            "several (an ipv4:/ipv6: list or a dns: name), else pick_first"))
    tls: bool = Field(False, description="use TLS (grpc.secure_channel) instead of plaintext")
    tls_root_cert: Path | None = Field(
        None, description="PEM file of the CA that signed the server's certificate; "
                          "None = the system roots (only with tls)")
    tls_server_name: str = Field(
        "", description="override of the name checked against the server's certificate "
                        "(grpc.ssl_target_name_override); empty = the host of `address`")
    api_key: str = Field("", description="API key sent in the request metadata; empty = read "
                                         "`api_key_env`, and send none if that is unset too")
    api_key_env: str = Field("TANDEM_API_KEY", description="environment variable with the key")
    api_key_header: str = Field(DEFAULT_API_KEY_HEADER, pattern=r"^[a-z0-9-]+$",
                                description="metadata key that carries the API key")
    reconnect_backoff_s: float = Field(
        0.1, gt=0, le=60, description="grpc channel's first reconnect backoff after a lost link")
    max_reconnect_backoff_s: float = Field(
        1.0, gt=0, le=300, description="grpc channel's longest reconnect backoff; kept short so a "
                                       "returning server is seen within about this long")
    keepalive_s: float = Field(20.0, ge=0, le=3600,
                               description="gRPC keepalive ping interval, also between calls "
                                           "(NATs and mobile links drop idle connections); at "
                                           "least 10 (the verifier's minimum); 0 = off")
    keepalive_timeout_s: float = Field(10.0, gt=0, le=600,
                                       description="a keepalive ping unanswered this long "
                                                   "closes the connection")

    @model_validator(mode="after")
    def _backoffs_ordered(self) -> "CloudLinkConfig":
        if self.max_reconnect_backoff_s < self.reconnect_backoff_s:
            raise ValueError("max_reconnect_backoff_s must be >= reconnect_backoff_s")
        return self

    @model_validator(mode="after")
    def _keepalive_allowed(self) -> "CloudLinkConfig":
        if 0 < self.keepalive_s < 10:
            raise ValueError("keepalive_s must be 0 (off) or >= 10: the verifier answers more "
                             "frequent pings with GOAWAY")
        return self


class DeviceProfile(Settings):
    """What drafting costs on this device, and the budget the draft policy must respect
    (FlexSpec-style channel- and energy-aware draft length). 0 = no limit / not modelled."""
    name: str = Field("laptop", description="profile name (reports and `tandem bench --device`)")
    max_draft_tokens_per_s: float = Field(0.0, ge=0, description="most draft tokens per second "
                                          "the device may spend (a phone-class cap); 0 = none")
    max_draft_per_generated: float = Field(0.0, ge=0, description="most draft tokens per "
                                           "generated token over a generation; 0 = none")
    joules_per_draft_token: float = Field(0.0, ge=0, description="energy of one draft token")
    joules_per_byte_up: float = Field(0.0, ge=0, description="radio energy per byte sent")
    joules_per_byte_down: float = Field(0.0, ge=0, description="radio energy per byte received")
    joules_budget_per_token: float = Field(0.0, ge=0, description="most joules per generated "
                                           "token (draft + radio); 0 = none")


class AdaptiveConfig(Settings):
    """The adaptive draft-length controller (edge/control/adaptive.py)."""
    max_draft_length: int = Field(16, ge=1, le=64, description="largest k the controller tries "
                                  "(also capped by the server's limit)")
    rtt_alpha: float = Field(0.3, gt=0, le=1, description="EWMA weight of a new RTT / "
                             "throughput / timing sample")
    acceptance_alpha: float = Field(0.1, gt=0, le=1, description="EWMA weight of a new "
                                    "acceptance observation (per position and per confidence "
                                    "bin)")
    prior_acceptance: float = Field(0.7, ge=0, le=1, description="acceptance assumed before "
                                    "any verdict (per position)")
    prior_weight: float = Field(4.0, ge=0, description="observations the prior is worth")
    dither: bool = Field(True, description="every other round draft k + max(1, k // 4), so "
                         "the uplink's cost per byte can be fitted apart from its latency and "
                         "the acceptance past k is measured")
    confidence_stop: bool = Field(True, description="end a block early when the draft's "
                                  "confidence says the next token no longer pays")
    adapt_q_entries: bool = Field(True, description="fewer sparse-q entries per position on a "
                                  "slow uplink (sampling; lossless either way)")
    min_q_entries: int = Field(4, ge=1, le=1024, description="fewest q entries per position")
    cloud_generate: bool = Field(True, description="the controller may ask the verifier to "
                                 "generate a run of tokens by itself (each a target pass) when "
                                 "that is expected faster than speculating (lossless either way)")
    cloud_generate_tokens: int = Field(16, ge=1, le=1024, description="fewest tokens per "
                                       "cloud-generates request, and a fresh controller's first "
                                       "run; more when the link's latency would otherwise take "
                                       "over a tenth of the run, or a second of the stream when "
                                       "speculation is not worth measuring again (capped by the "
                                       "tokens left and the verifier's limit)")
    prior_path: Path | None = Field(None, description="file where the acceptance prior is "
                                    "kept between sessions (JSON); None = not persisted")


SwitchState = Literal["easy", "hard"]


class EntropySwitchConfig(Settings):
    """The entropy switch (edge/control/entropy.py): thresholds in nats of the draft's
    next-token distribution, averaged over the last `window` drafted positions."""
    window: int = Field(8, ge=1, le=1024,
                        description="drafted positions the rolling entropy averages over")
    # Defaults from the shipped models on held-out code: the draft's entropy has quartiles
    # 2.4 / 4.2 / 5.3 nats, and above ~3 nats tandem-small agrees with the target clearly more
    # often than the draft (0.83 vs 0.76); below it both agree >= 0.9 of the time.
    enter_hard: float = Field(4.0, ge=0, le=20,
                              description="switch easy -> hard when the rolling entropy is at or "
                                          "above this (nats)")
    exit_hard: float = Field(3.0, ge=0, le=20,
                             description="switch hard -> easy when the rolling entropy is at or "
                                         "below this (nats); below enter_hard (hysteresis)")
    # Fast mode's pair is higher: there the draft's own per-position confidence already sends
    # each unsure token to the target (fast_min_confidence), and at 4 nats whole spans a fast
    # request could emit went to the verifier (tandem ladder: 45-74% verified, vs 38-40% at 5.5).
    fast_enter_hard: float = Field(5.5, ge=0, le=20,
                                   description="enter_hard for a fast request: above it, blocks "
                                               "are verified whole (only without a stated "
                                               "agreement, client.fast.min_agreement None)")
    fast_exit_hard: float = Field(5.0, ge=0, le=20,
                                  description="exit_hard for a fast request; below fast_enter_hard")
    min_dwell_rounds: int = Field(2, ge=0, le=1000,
                                  description="rounds to stay in a state before switching again")
    start_state: SwitchState = Field("hard", description="state before any entropy was seen: 'hard' "
                                                   "drafts the start with the strong model and, "
                                                   "in fast mode, verifies it")
    hard_max_k: int = Field(3, ge=0, le=64, description="most draft tokens per round in the "
                                                        "hard state")
    # 0.125: on two sets of 8 held-out prompts x 64 tokens (tandem ladder, tandem-small writing
    # easy text) the cloud verified 38% / 36% of tokens at 95.9% / 95.3% agreement with the
    # target; 0.15 gave 40% at 97.1%, 0.2 44-46% at 97.5%, 0.1 fell below 95% agreement.
    fast_min_confidence: float = Field(
        0.125, ge=0, le=1, description="fast mode without a stated agreement (client.fast."
                                     "min_agreement None): an unverified span ends before the "
                                     "first position whose draft top probability is below this; "
                                     "the target is asked for that position")
    fast_unsure_k: int = Field(
        0, ge=0, le=64, description="fast mode: draft tokens in the verified round that follows "
                                    "an unsure position; 0 asks the target for that one token, "
                                    "so the cloud verifies only where the draft is unsure")
    explore_every: int = Field(8, ge=0, le=1000,
                               description="choose each state's rung by its measured speed "
                                           "(committed tokens per second of draft + round trip), "
                                           "trying the other rungs every this many rounds in the "
                                           "state; 0 = fixed: cheapest rung in easy text, "
                                           "strongest in hard")
    easy_drafter: str | None = Field(None, description="ladder model that drafts easy text; "
                                                       "None = the first (cheapest) rung")
    hard_drafter: str | None = Field(None, description="ladder model that drafts hard text; "
                                                       "None = the last (strongest) rung")
    fast_drafter: str | None = Field(None, description="fast mode: ladder model that drafts easy "
                                                       "text, emitted unverified; None = the last "
                                                       "(strongest) rung")

    @model_validator(mode="after")
    def _hysteresis(self) -> "EntropySwitchConfig":
        if self.exit_hard > self.enter_hard:
            raise ValueError("exit_hard must be <= enter_hard (hysteresis)")
        if self.fast_exit_hard > self.fast_enter_hard:
            raise ValueError("fast_exit_hard must be <= fast_enter_hard (hysteresis)")
        return self



class FastModeConfig(Settings):
    """Fast mode held to a stated agreement (edge/fast_mode.py, edge/fast_calibration.py)."""
    min_agreement: float | None = Field(0.95, gt=0, le=1, description=(
        "a fast request's default min_agreement: the expected share of emitted tokens the "
        "target would itself choose; spans go unverified only while the generation's expected "
        "agreement, by the calibration, stays at or above it. None = no stated agreement: "
        "the entropy switch's fixed cut (entropy.fast_min_confidence) ends spans"))
    calibration_prior: Path | None = Field(Path("models/fast-calibration.json"), description=(
        "the shipped prior of P(target agrees | draft confidence) per local model "
        "(models/train/fit_fast_prior.py); None = every model starts flat (verify all "
        "until measured)"))
    prior_models: dict[str, str] = Field(
        default_factory=lambda: {"draft": "tandem-draft", "small": "tandem-small"},
        description="ladder rung name -> its entry in the prior file (the model pair)")
    prior_tokens: float = Field(1000.0, ge=0, le=1e7, description=(
        "checked tokens the prior is worth at the start; it decays like the edge's evidence"))
    half_life_tokens: float = Field(1000.0, gt=0, le=1e7, description=(
        "checked tokens after which evidence (the prior included) counts half"))
    audit_share: float = Field(0.05, ge=0, le=1, description=(
        "share of the confident tokens (spans that could go unverified) the target checks "
        "anyway, so the calibration sees itself being wrong"))

class ClientConfig(Settings):
    """How one generation session drafts, waits, retries and falls back to local decoding."""
    draft_length: int = Field(4, ge=0, le=64, description="draft tokens per round (fixed k); "
                                                          "capped by the server's limit")
    target_model: str = Field("", description="target model to ask for; empty = server default")
    policy: str = Field("fixed", description="draft policy by name: fixed (draft_length every "
                        "round), adaptive, or a peer's rule (edge/control)")
    draft_ahead: bool = Field(False, description="pipelining: draft the next block while the "
                              "current one is being verified (edge/rounds/pipelined.py)")
    send_ahead: int = Field(1, ge=1, le=8, description="pipelining: most blocks in flight (1 = "
                            "none; also capped by the verifier's max_in_flight); fixed uses it "
                            "every round, adaptive chooses up to it on long RTTs")
    max_passes_per_token: float | None = Field(
        None, gt=0, le=1, description="an operator's cap on the verifier's cost: the adaptive "
        "controller keeps target forward passes per committed token under it (running, over the "
        "client's rounds) and maximises speed within it; below what the draft's acceptance "
        "allows (~1 / the longest expected accepted run) it spends the fewest passes it can. "
        "None = no cap: speed alone (cloud-generates costs one pass per token)")
    min_tokens_per_s: float = Field(15.0, ge=0, le=100_000, description=(
        "the speed floor the adaptive controller keeps to while a loaded verifier prices its "
        "passes (edge/control/pricing.py): it spends fewer passes per token only among options "
        "expected this fast (the fastest when none is); at price 0 speed alone decides. "
        "An expected speed, so it keeps a margin over the SLO: 15 (a mean TPOT of 67 ms) "
        "keeps the p90 within a TPOT SLO of 100 ms where 10 would leave about half the "
        "requests over it; a request may set its own (min_tokens_per_s)"))
    adaptive: AdaptiveConfig = Field(default_factory=AdaptiveConfig)
    device: DeviceProfile = Field(default_factory=DeviceProfile)
    entropy: EntropySwitchConfig = Field(default_factory=EntropySwitchConfig)
    fast: FastModeConfig = Field(default_factory=FastModeConfig)
    mode: Literal["lossless", "fast"] = Field(
        "lossless", description="default mode of a request that names none: lossless (every "
                                "token verified) or fast (spans emitted unverified while the "
                                "expected agreement holds, client.fast; drafted by the entropy "
                                "switch whatever `policy` is)")
    max_unverified_run: int = Field(16, ge=0, le=4096,
                                    description="fast mode: most tokens in a row emitted "
                                                "without verification (a request may lower it)")
    max_q_entries: int = Field(DEFAULT_MAX_ENTRIES, ge=1, le=1024,
                               description="most ids in one sparse draft distribution q "
                                           "(sampling); capped by the server's limit")
    q_codec: Literal["entropy", "plain"] = Field(
        "entropy", description="how q travels when sampling: entropy = one range-coded byte "
                               "string per block on a coarse level grid (tandem/qcodec.py), when "
                               "the verifier accepts it; plain = ids and weights per position "
                               "(SparseDistribution, what older verifiers take)")
    coded_q_entries: int = Field(DEFAULT_CODED_ENTRIES, ge=1, le=DEFAULT_CODED_ENTRIES,
                                 description="most ids in one coded q (q_codec entropy; its "
                                             "cut relative to the top keeps about 10); capped "
                                             "by the server's limit")
    q_scale: int = Field(DEFAULT_SCALE, ge=1, le=2**31 - 1,
                         description="integer weight of q's most likely id; the others are "
                                     "rounded relative to it")
    open_timeout_s: float = Field(30.0, gt=0, le=600,
                                  description="wait for Opened (includes the server's prefill)")
    round_timeout_s: float = Field(30.0, gt=0, le=600, description=(
        "a reply (Verdict, generated token) still missing this long, although the verifier "
        "answers probes, fails the round and the stream is re-opened; a slow reply is waited "
        "for until then (edge/link/wait.py WaitRule)"))
    stall_timeout_s: float = Field(3.0, gt=0, le=600, description=(
        "the link counts as down when nothing came from the verifier, neither on the stream "
        "nor as an answer to a probe, for this long (besides transport errors: connect "
        "failure, reset, an unanswered keepalive ping); longer than the link's longest "
        "silent gap (cellular traces: up to ~4 s)"))
    max_retries: int = Field(6, ge=0, le=100,
                             description="reconnect attempts after a broken link before "
                                         "generating locally")
    retry_initial_backoff_s: float = Field(0.1, ge=0, le=60,
                                           description="sleep before the second attempt")
    retry_max_backoff_s: float = Field(2.0, ge=0, le=300, description="longest sleep between "
                                                                      "attempts")
    retry_multiplier: float = Field(2.0, ge=1, le=10, description="backoff growth per attempt")
    retry_jitter: float = Field(0.2, ge=0, le=1,
                                description="each sleep is scaled by 1 + uniform(-j, j), so "
                                            "many edges do not retry in lockstep")
    offline_after_s: float = Field(5.0, ge=0, le=3600,
                                   description="deadline for reconnecting; past it the edge "
                                               "generates locally (tokens unverified)")
    offline_enabled: bool = Field(True, description="generate locally when the cloud stays "
                                                    "unreachable; False = raise instead")
    offline_probe_tokens: int = Field(16, ge=1, le=4096,
                                      description="while offline, try to re-open every this "
                                                  "many locally generated tokens")
    max_evictions_per_round: int = Field(8, ge=1, le=1000,
                                         description="re-opens after Evicted for one round "
                                                     "before the link counts as broken")
    # --- the offline policy (edge/link/offline.py, edge/link/monitor.py) ---------------------
    target_digest: str = Field("", pattern=r"^(sha256:[0-9a-f]{64})?$", description=(
        "pin the verifier's target: its identity digest (tandem-cloud info: target.digest); "
        "every open and re-open must report it, else the request fails naming both; empty = "
        "no pin (a generation still refuses a target that changes mid-way)"))
    offline: Literal["continue", "wait", "require_verified"] = Field("wait", description=(
        "while the verifier is away: continue (generate locally, tokens unverified), wait "
        "(pause up to offline_wait_s for it, then resume verified; locally after that) or "
        "require_verified (fail naming the cause rather than emit an unverified token); a "
        "request may choose its own"))
    # 20 s: the verifier starts serving 3-5 s after launch here (torch backend), a cellular
    # link falls silent for up to ~4 s (shared/traces), a restarted verifier is back in
    # seconds; past 20 s a user is better served by local text, flagged unverified.
    offline_wait_s: float = Field(20.0, ge=0, le=3600, description=(
        "offline: wait pauses at most this long for the verifier over a whole generation "
        "(the start-up wait for a verifier never reached included)"))
    deadline_margin: float = Field(2.0, ge=1, le=100, description=(
        "a verdict is late after margin x (smoothed RTT + 4 x its variation + the verifier's "
        "reported time for the block): the link then probes the verifier and keeps waiting"))
    deadline_floor_s: float = Field(1.0, gt=0, le=60, description=(
        "a verdict or Opened is never late sooner than this, whatever the link measured"))
    open_deadline_s: float = Field(3.0, gt=0, le=600, description=(
        "when Opened is late before any round measured the link (then derived from RTT and "
        "the verifier's time per token; open_timeout_s is the longest wait)"))
    probe_interval_s: float = Field(0.25, gt=0, le=60, description=(
        "after a failure, try the verifier again this soon (doubling per failed probe)"))
    max_probe_interval_s: float = Field(1.0, gt=0, le=600, description=(
        "the longest wait between probes while offline: a returning verifier is used within "
        "about this long (sooner when the link monitor sees it answer)"))
    monitor_interval_s: float = Field(0.25, gt=0, le=60, description=(
        "the link monitor's probe interval while the link is not up"))
    monitor_interval_up_s: float = Field(2.0, gt=0, le=600, description=(
        "the link monitor's probe interval while the link is up"))

    @model_validator(mode="after")
    def _backoffs_ordered(self) -> "ClientConfig":
        if self.retry_max_backoff_s < self.retry_initial_backoff_s:
            raise ValueError("retry_max_backoff_s must be >= retry_initial_backoff_s")
        return self


class DaemonConfig(Settings):
    """The local HTTP daemon (`tandem-edge serve`, edge/daemon/)."""
    host: str = Field("127.0.0.1", description="bind address of the local HTTP API")
    port: int = Field(8080, ge=0, le=65535, description="HTTP port; 0 = any free port")
    model_name: str = Field("tandem-draft", min_length=1,
                            description="model id the API advertises (GET /v1/models) and accepts")
    default_max_tokens: int = Field(64, ge=1, le=65536,
                                    description="tokens to generate when a request gives no max_tokens")
    max_tokens_limit: int = Field(512, ge=1, le=65536,
                                  description="largest max_tokens a request may ask for")
    max_prompt_tokens: int = Field(768, ge=1, le=131072,
                                   description="longest prompt (in tokens) a request may send; "
                                               "prompt + max_tokens must also fit the draft's n_ctx")
    pool_size: int = Field(4, ge=1, le=256,
                           description="draft runtimes kept loaded = generations served at once "
                                       "(one session each)")
    max_waiting: int = Field(64, ge=0, le=100_000,
                             description="requests that may wait for a free runtime; beyond it "
                                         "the API answers 503 overloaded")
    request_timeout_s: float = Field(300.0, gt=0, le=86_400,
                                     description="a generation running longer is stopped (504)")
    log_level: str = Field("info", pattern=r"^(critical|error|warning|info|debug|trace)$",
                           description="log level of the daemon and uvicorn; info shows the "
                                       "listening line, one access line per request and "
                                       "link-state changes")
    api_key: str = Field("", description="key HTTP clients must send (`Authorization: Bearer "
                                         "KEY` or `x-api-key`); empty = none. Required when "
                                         "`host` is not a loopback address")
    allow_insecure_public: bool = Field(False, description="serve a non-loopback `host` "
                                                           "without `api_key` (not advised: "
                                                           "the daemon holds the verifier's key)")
    cors_origins: list[str] = Field(default_factory=list,
                                    description="browser origins allowed by CORS (e.g. "
                                                "http://localhost:3000, or * for any); empty = "
                                                "no CORS headers")
    max_body_bytes: int = Field(4 * 2**20, ge=1024, le=2**31 - 1,
                                description="largest request body, enforced while it is read "
                                            "(413 beyond)")
    strict_openai: bool = Field(False, description="refuse request fields the API does not "
                                                   "know (400) instead of ignoring them with a "
                                                   "logged warning")

    @model_validator(mode="after")
    def _default_within_limit(self) -> "DaemonConfig":
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError("default_max_tokens must be <= max_tokens_limit")
        return self


class LadderModelConfig(DraftConfig):
    """One more local model on the edge's ladder (edge/control/entropy.py picks the drafter)."""
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$",
                      description="the model's name in the ladder (Plan.drafter, metrics)")


DEFAULT_DRAFTER = "draft"  # the ladder name of the `draft:` model


class EdgeConfig(Settings):
    """configs/edge.yaml."""
    cloud: CloudLinkConfig = Field(default_factory=CloudLinkConfig)
    draft: DraftConfig = Field(default_factory=DraftConfig)
    ladder: list[LadderModelConfig] = Field(
        default_factory=list, description="more local models after `draft` (the ladder's "
                                          "first rung, named 'draft'), cheapest first; the "
                                          "daemon keeps each loaded and the draft policy picks "
                                          "which one drafts a block")
    client: ClientConfig = Field(default_factory=ClientConfig)
    daemon: DaemonConfig = Field(default_factory=DaemonConfig)

    @model_validator(mode="after")
    def _ladder_names_unique(self) -> "EdgeConfig":
        names = [DEFAULT_DRAFTER] + [m.name for m in self.ladder]
        if len(set(names)) != len(names):
            raise ValueError(f"ladder names must be unique and not {DEFAULT_DRAFTER!r}: {names}")
        return self

    def local_models(self) -> dict[str, DraftConfig]:
        """Every local model by ladder name, cheapest first: `draft` then the ladder."""
        return {DEFAULT_DRAFTER: self.draft, **{m.name: m for m in self.ladder}}


def _resolve_model(draft: DraftConfig) -> DraftConfig:
    return draft.model_copy(update={
        "model_path": resolve_path(draft.model_path),
        "tokenizer_dir": resolve_path(draft.tokenizer_dir)
        if draft.tokenizer_dir is not None else None})


def resolve_paths(config: EdgeConfig) -> EdgeConfig:
    """The same config with the local models' and the certificate's paths resolved."""
    draft = _resolve_model(config.draft)
    ladder = [_resolve_model(m) for m in config.ladder]
    cloud = config.cloud
    if cloud.tls_root_cert is not None:
        cloud = cloud.model_copy(update={"tls_root_cert": resolve_path(cloud.tls_root_cert)})
    return config.model_copy(update={"draft": draft, "ladder": ladder, "cloud": cloud})


_MODEL_FILES = {"llama.cpp": "*.gguf", "onnxruntime": "*.onnx"}


def model_for_backend(draft: DraftConfig) -> Path:
    """The model that `draft.backend` reads from the draft's directory: the HF directory itself
    for torch, else its one .gguf / .onnx file (an f32 GGUF preferred)."""
    directory = draft.resolved_tokenizer_dir
    if draft.backend == "torch":
        return directory
    found = sorted(directory.glob(_MODEL_FILES[draft.backend]),
                   key=lambda p: (not p.stem.endswith("-f32"), p.name))
    if not found:
        raise FileNotFoundError(f"no {_MODEL_FILES[draft.backend]} file for backend "
                                f"{draft.backend!r} in {directory}")
    return found[0]
