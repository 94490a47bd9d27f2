"""OpenAI-compatible request and response bodies for /v1/completions, /v1/chat/completions and
/v1/models, plus the error body.

Requests accept the OpenAI fields a client commonly sends. Fields whose non-default value would
change what the target model's output means (penalties, logit bias, logprobs, n > 1, tools) are
refused with a 400 rather than silently ignored; unknown fields are refused as OpenAI does.
Tandem's extensions (sent by OpenAI clients through `extra_body`): `top_k`, `draft_length`
(the first round's draft length) and `tandem_trace` (return the per-round trace in the stats).

Every response carries Tandem's own statistics in the extra top-level field `tandem`, which
OpenAI clients keep as an extra attribute and otherwise ignore.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# ---------------------------------------------------------------------------------------------
# Requests


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="advertised model id (see GET /v1/models)")
    max_tokens: int | None = Field(None, ge=1, description="tokens to generate; None = daemon default")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="Tandem extension; 0 = off")
    seed: int | None = Field(None, ge=0, description="sampling seed; None = daemon picks one")
    stop: str | list[str] | None = Field(None, description="up to 4 stop strings")
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, description="only 1 is supported")
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    draft_length: int | None = Field(None, ge=1, le=64, description="Tandem extension: first round's draft length")
    tandem_trace: bool = Field(False, description="Tandem extension: include the per-round trace")

    @field_validator("n")
    @classmethod
    def _single_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, value: float) -> float:
        if value != 0.0:
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
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty")
        return stops

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])  # type: ignore[arg-type]  # normalised by _stop_list

    @property
    def include_usage_chunk(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class CompletionRequest(_Request):
    """POST /v1/completions. `prompt` is text or a list of token ids (one prompt per request)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) != 1:
                raise ValueError("batched prompts are not supported; send one prompt per request")
            value = value[0]
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be empty")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("logprobs are not supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix (insertion) is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return value


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None

    @model_validator(mode="after")
    def _supported(self) -> ChatCompletionRequest:
        if self.logprobs or self.top_logprobs:
            raise ValueError("logprobs are not supported")
        if self.tools or self.tool_choice not in (None, "none", "auto"):
            raise ValueError("tools are not supported")
        if self.response_format and self.response_format.get("type") != "text":
            raise ValueError("only response_format type 'text' is supported")
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
    bytes_up: int
    bytes_down: int
    wall_s: float
    ttft_s: float | None
    tokens_per_s: float
    reopens: int = Field(description="sessions re-opened after an outage or eviction")
    draft_backend: str
    trace: list[RoundTrace] | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class CompletionResponse(BaseModel):
    """Both the whole response and each streamed chunk of /v1/completions (same shape, as in
    OpenAI); chunks carry `usage` and `tandem` only on the last one."""
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    tandem: TandemStats | None = None


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
    tandem: TandemStats | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tandem"


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


_Request.model_rebuild()
CompletionRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()
