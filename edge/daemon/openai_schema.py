"""OpenAI-compatible request and response bodies for /v1/completions, /v1/chat/completions and
/v1/models, plus the error body.

Requests accept the OpenAI fields a client commonly sends, and like vLLM and llama.cpp they
ignore fields they do not know (the daemon logs a warning naming them; `daemon.strict_openai`
turns that into a 400). Options whose non-default value would change the target's distribution
(penalties, logit bias, min_p, logprobs, n > 1, constrained output) are refused with a 400 rather
than silently ignored, because the output must stay the target's. Numbers are checked against
the ranges the wire can carry (seed < 2^64, top_k < 2^32), and text must be valid Unicode (no
lone surrogates), so bad input is a 400, never a 500.
Tandem's extensions (sent by OpenAI clients through `extra_body`): `top_k`, `draft_length`
(the first round's draft length), `ignore_eos`, `tandem_trace` (return the per-round trace in
the stats) and `min_tokens_per_s` (the request's speed floor under a loaded verifier).

Every response carries Tandem's own statistics in the extra top-level field `tandem`, which
OpenAI clients keep as an extra attribute and otherwise ignore.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP_STRINGS = 64      # vLLM and llama.cpp set no limit; IDE plugins send 6 or more
MAX_STOP_LENGTH = 1024     # characters in one stop string
MAX_PROMPTS = 64           # prompts in one /v1/completions request
UINT64 = 2**64
UINT32 = 2**32


def surrogate_path(value: Any, path: str = "") -> str | None:
    """The location of the first string holding a lone surrogate (not encodable as UTF-8)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = surrogate_path(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None

# ---------------------------------------------------------------------------------------------
# Requests


class OpenAIRequest(BaseModel):
    # Unknown fields are kept in `model_extra`; the app warns about them (or refuses them in
    # strict mode) instead of failing every client that sends one more option.
    model_config = ConfigDict(extra="allow")

    model: str = Field(description="advertised model id (see GET /v1/models)")
    max_tokens: int | None = Field(None, ge=1, lt=UINT32,
                                   description="tokens to generate; None = daemon default")
    temperature: float | None = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float | None = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(0, ge=-1, lt=UINT32, description="Tandem extension; 0 or -1 = off")
    min_p: float | None = Field(None, ge=0.0, le=1.0, description="only 0 (off) is supported")
    seed: int | None = Field(None, ge=0, lt=UINT64, description="sampling seed; None = daemon picks one")
    stop: str | list[str] | None = Field(None, description=f"up to {MAX_STOP_STRINGS} stop strings")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(1, description="only 1 is supported")
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    repetition_penalty: float | None = Field(None, description="only 1 (off) is supported")
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    service_tier: str | None = Field(None, description="accepted and ignored")
    ignore_eos: bool = Field(False, description="do not stop at the model's end of text")
    draft_length: int | None = Field(None, ge=1, le=64, description="Tandem extension: first round's draft length")
    tandem_trace: bool = Field(False, description="Tandem extension: include the per-round trace")
    mode: Literal["lossless", "fast"] | None = Field(
        None, description="Tandem extension: lossless (every token verified) or fast (the edge "
                          "emits low-entropy spans unverified; stats.verified_fraction says how "
                          "much the target checked); None = client.mode")
    max_unverified_run: int | None = Field(None, ge=0, le=4096, description=(
        "Tandem extension: fast mode's longest run of unverified tokens; None = "
        "client.max_unverified_run"))
    min_agreement: float | None = Field(None, gt=0, le=1, description=(
        "Tandem extension, fast mode: the expected share of emitted tokens the target would "
        "itself choose; spans go unverified only while the calibrated expectation stays at or "
        "above it; None = client.fast.min_agreement"))
    offline: Literal["continue", "wait", "require_verified"] | None = Field(
        None, description="Tandem extension: while the verifier is away, continue locally "
                          "(unverified), wait up to offline_wait_s for it, or require_verified "
                          "(fail instead of emitting unverified tokens); None = client.offline")
    offline_wait_s: float | None = Field(None, ge=0, le=3600, description=(
        "Tandem extension: the longest pause of offline 'wait'; None = client.offline_wait_s"))
    min_tokens_per_s: float | None = Field(None, ge=0, le=100_000, description=(
        "Tandem extension: the speed this request needs; while the verifier is loaded the "
        "controller saves its passes only down to it; None = client.min_tokens_per_s"))

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = surrogate_path(data)
        if where is not None:
            raise ValueError(f"{where}: text holds a lone UTF-16 surrogate (not valid Unicode)")
        return data

    @model_validator(mode="after")
    def _nulls_are_defaults(self) -> OpenAIRequest:
        # OpenAI clients send explicit nulls for options they leave unset.
        for name in ("temperature", "top_p", "top_k", "n", "stream", "frequency_penalty",
                     "presence_penalty"):
            if getattr(self, name) is None:
                setattr(self, name, type(self).model_fields[name].default)
        if self.top_k == -1:  # vLLM's spelling of "off"
            self.top_k = 0
        return self

    @field_validator("min_p")
    @classmethod
    def _no_min_p(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("min_p is not supported (it would change the target's distribution)")
        return value

    @field_validator("repetition_penalty")
    @classmethod
    def _no_repetition_penalty(cls, value: float | None) -> float | None:
        if value not in (None, 1.0):
            raise ValueError("penalties are not supported (they would change the target's "
                             "distribution)")
        return value

    @property
    def unknown_fields(self) -> list[str]:
        return sorted(self.model_extra or {})

    @field_validator("n")
    @classmethod
    def _single_choice(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("penalties are not supported (they would change the target's distribution)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported (it would change the target's distribution)")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences")
        if any(len(s) > MAX_STOP_LENGTH for s in stops):
            raise ValueError(f"a stop sequence may hold at most {MAX_STOP_LENGTH} characters")
        return [s for s in stops if s]  # an empty stop string can never match: ignored

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])  # type: ignore[arg-type]  # normalised by _stop_list

    @property
    def include_usage_chunk(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's stream_options.continuous_usage_stats: usage so far in every content chunk
        (only together with include_usage, as there)."""
        return self.include_usage_chunk and bool(self.stream_options.continuous_usage_stats)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = Field(False, description="with include_usage: "
                                                                   "usage so far in every chunk")


class CompletionRequest(OpenAIRequest):
    """POST /v1/completions. `prompt` is text, a list of token ids, or a list of several of
    either (one choice per prompt, `index` in order)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = Field(None, description="fill-in-the-middle is not supported: a "
                                                 "non-empty suffix is ignored with a warning")
    best_of: int | None = None
    return_token_ids: bool = Field(False, description="vLLM's extension: each choice also "
                                                      "lists its completion token ids")

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: Any) -> Any:
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) > MAX_PROMPTS:
                raise ValueError(f"at most {MAX_PROMPTS} prompts in one request")
            if any(isinstance(p, list) and not p for p in value):
                raise ValueError("a token-id prompt must not be empty")
        elif isinstance(value, list) and not value:
            raise ValueError("prompt must not be empty")
        return value

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request, one per choice."""
        value = self.prompt
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            return list(value)  # type: ignore[arg-type]
        return [value]  # type: ignore[list-item]

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("logprobs are not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return value


class ContentPart(BaseModel):
    """One part of a message's content. Only text can be served by a text model."""
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_only(self) -> ContentPart:
        if self.type not in ("text", "input_text"):
            raise ValueError(f"content parts of type {self.type!r} are not supported by this "
                             "text model; send text")
        if self.text is None:
            raise ValueError("a text content part needs `text`")
        return self


class ChatMessageIn(BaseModel):
    """One message in the shapes of the OpenAI spec: an assistant turn may carry `tool_calls`
    with null content; a `tool` message answers a call by `tool_call_id`."""
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _has_content(self) -> ChatMessageIn:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content (only an assistant message "
                             "with tool_calls may have null content)")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)

    def template_dict(self) -> dict[str, Any]:
        """The message as chat templates read it (content flattened to text)."""
        out: dict[str, Any] = {**(self.model_extra or {}), "role": self.role,
                               "content": None if self.content is None else self.text}
        for key in ("name", "tool_calls", "tool_call_id"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


class ChatCompletionRequest(OpenAIRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, lt=UINT32)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = Field(None, description="passed to the chat template "
                                                                 "when it renders tools")
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="extra variables for the chat template (e.g. enable_thinking)")
    add_generation_prompt: bool = Field(True, description="end the prompt with the template's "
                                                          "assistant header")

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_chat_logprobs(cls, value: Any) -> Any:
        if value:
            raise ValueError("logprobs are not supported")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none", "auto"):
            # Forcing a call would constrain decoding, and so change the target's distribution.
            raise ValueError("tool_choice may be 'auto' or 'none'; forcing a tool call is not "
                             "supported")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value and value.get("type") != "text":
            raise ValueError("only response_format type 'text' is supported (constrained output "
                             "would change the target's distribution)")
        return value

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None:
            # The newer name wins; both mean "tokens to generate".
            self.max_tokens = self.max_completion_tokens
        return self


# ---------------------------------------------------------------------------------------------
# Responses


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class RoundTrace(BaseModel):
    """One round as the session client saw it (only with `tandem_trace`)."""
    t_s: float = Field(description="seconds since the request started, when the verdict arrived")
    draft_length: int
    accepted: int
    rtt_ms: float = Field(description="Draft sent -> Verdict received, the verifier's time included")
    server_ms: float | None = Field(None, description="the verifier's queue + forward + verify time")
    mode: str = Field("verify", description="verify: a drafted block the verifier checked; cloud: "
                                            "a run the verifier generated itself (draft_length 0, "
                                            "rtt_ms to its first token)")
    tokens: int = Field(0, description="tokens the round committed")


class AgreementStats(BaseModel):
    """A fast request's agreement with the target (edge/fast_mode.py): expected by the edge's
    calibration over every emitted token (a verified token agrees), and measured on the
    confident draft tokens the target checked (audits, verified rounds)."""
    min_agreement: float
    expected_agreement: float
    measured_agreement: float | None = Field(description="None when no confident token was checked")
    checked_tokens: int
    checked_expected_agreement: float | None = Field(
        description="what the calibration expected of those checked tokens")


class TandemStats(BaseModel):
    """Tandem's own statistics for one generation (the extra `tandem` field)."""
    rounds: int = Field(description="Draft -> Verdict exchanges")
    accepted_lengths: list[int] = Field(description="accepted length n of each round")
    mean_accepted_length: float = Field(description="tau = 1 + accepted / rounds (1.0 with no rounds)")
    target_passes: int = Field(description="target forward passes spent on this generation")
    target_passes_per_token: float
    verified_tokens: int
    unverified_tokens: int
    verified_fraction: float = Field(description="share of emitted tokens the target verified")
    unverified_by_cause: dict[str, int] = Field(
        default_factory=dict, description="unverified tokens by cause: outage, startup (the "
        "verifier not reached yet), overload, fast_mode")
    bytes_up: int
    bytes_down: int
    wall_s: float = Field(description="seconds from the request's arrival to its last token "
                                      "(queue_s included)")
    queue_s: float = Field(0.0, description="seconds the request waited for a free draft "
                                            "runtime (a pool slot) before its generation started")
    ttft_s: float | None = Field(description="seconds from the request's arrival to its first "
                                             "token (queue_s included, as a client measures it)")
    tokens_per_s: float = Field(description="tokens / (wall_s - queue_s): the generation's "
                                            "speed once it had a slot")
    reopens: int = Field(description="sessions re-opened after an outage or eviction")
    moves: int = Field(0, description="re-opens that another verifier took (several verifiers "
                                      "behind a balancer: each re-prefilled the whole context)")
    verifier: str = Field("", description="the verifier that served the session last "
                                          "(its server.name; empty: none reached)")
    draft_backend: str
    agreement: AgreementStats | None = Field(None, description="fast mode (calibrated): the "
                                             "expected and the measured agreement")
    trace: list[RoundTrace] | None = None


class TandemDelta(BaseModel):
    """What stands behind one streamed text delta (the extra `tandem` field of each content
    chunk; the last chunk carries TandemStats instead)."""
    verified: bool = Field(description="every token in this delta was checked by the target")
    link_state: str = Field(description="the verifier link when the delta was sent: up, "
                                        "degraded, down, overloaded or misconfigured")


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None
    token_ids: list[int] | None = Field(None, description="with return_token_ids: the "
                                                          "completion's token ids")
    tandem: TandemStats | None = Field(None, description="this choice's stats, when a request "
                                                         "has several prompts")


class CompletionResponse(BaseModel):
    """Both the whole response and each streamed chunk of /v1/completions (same shape, as in
    OpenAI); content chunks carry a TandemDelta in `tandem`, the last one TandemStats and
    `usage`."""
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    tandem: TandemStats | TandemDelta | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: Literal["stop", "length"]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    tandem: TandemStats


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    tandem: TandemStats | TandemDelta | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tandem"
    max_model_len: int | None = Field(None, description="context length in tokens (prompt + "
                                                        "output), as vLLM reports it")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


OpenAIRequest.model_rebuild()
CompletionRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()
