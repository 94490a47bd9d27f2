"""Domain errors of the daemon and their OpenAI-style HTTP form.

The pool raises these; the app maps each to its status code and the body
`{"error": {"message", "type", "param", "code"}}` that OpenAI clients parse into their
exception classes (400 BadRequestError, 404 NotFoundError, ...).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edge.daemon.openai_schema import ErrorBody, ErrorResponse


class ApiError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None
    retry_after_s: int | None = None  # sent as Retry-After (every 503 has one)

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorBody(message=self.message, type=self.type,
                                             param=self.param, code=self.code))


class BadRequest(ApiError):
    """Bad JSON, a value out of range, an unsupported option."""
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(BadRequest):
    """The prompt (or prompt + max_tokens) does not fit the configured limits."""
    code = "context_length_exceeded"


class Unauthorized(ApiError):
    """No or a wrong daemon API key (daemon.api_key)."""
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class BodyTooLarge(BadRequest):
    """The body passed daemon.max_body_bytes while it was read."""
    status = 413
    code = "request_too_large"


class ModelNotFound(ApiError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model '{model}' does not exist", param="model")


class RouteNotFound(ApiError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(ApiError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class QueueFull(ApiError):
    """Every draft runtime is busy and the wait queue is full."""
    status = 503
    type = "server_error"
    code = "overloaded"
    retry_after_s = 1


class GenerationTimeout(ApiError):
    status = 504
    type = "server_error"
    code = "timeout"


class VerifierError(ApiError):
    """The verifier refused the session (fingerprint, API key) or broke the protocol."""
    status = 502
    type = "server_error"
    code = "verifier_error"


class ServiceUnavailable(ApiError):
    """The request cannot be served without the verifier, and the verifier is away: local
    generation is disabled (client config), or the request requires verified tokens
    (offline "require_verified", or "wait" past its bound). The client's CloudUnavailable and
    VerifierUnavailable (edge/link/errors.py) answer this."""
    status = 503
    type = "server_error"
    code = "verifier_unavailable"
    retry_after_s = 5


class GenerationFailed(ApiError):
    """The session client raised; the daemon stays up and reports it."""
    status = 500
    type = "server_error"
    code = "generation_failed"


_JSON_ERROR_TYPES = {"json_invalid", "json_type", "model_attributes_type"}
_BUILTIN_TAGS = {"body", "str", "int", "float", "bool", "list", "dict", "none"}


def _is_type_tag(part: Any) -> bool:
    """pydantic puts union-member tags ("str", "list[int]", "TextPart") into error locations;
    they are not request fields, so they stay out of `param`."""
    if isinstance(part, int):
        return False
    text = str(part)
    return text in _BUILTIN_TAGS or "[" in text or text[:1].isupper()


def from_validation_errors(errors: Sequence[dict[str, Any]]) -> BadRequest:
    """One BadRequest for FastAPI's RequestValidationError.errors() (its 422 becomes 400).

    A body that is not JSON (or not a JSON object) gets OpenAI's parse-error wording; otherwise
    the first error names the offending field in `param` (e.g. "messages.0.role").
    """
    if not errors:
        return BadRequest("invalid request")
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ()) if not _is_type_tag(part)]
    if first.get("type") in _JSON_ERROR_TYPES and not loc:
        return BadRequest("We could not parse the JSON body of your request. (HINT: this likely "
                              "means you aren't using your HTTP library correctly. The request body "
                              "must be a JSON object.)")
    if first.get("type") == "json_invalid":
        return BadRequest(f"We could not parse the JSON body of your request: {first.get('msg')}")
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        return BadRequest(f"Unrecognized request argument supplied: {param}", param=param)
    if first.get("type") == "missing" and param is None:
        return BadRequest("The request body is empty; it must be a JSON object.")
    if first.get("type") == "missing":
        return BadRequest(f"Missing required parameter: '{param}'.", param=param)
    message = str(first.get("msg", "invalid value"))
    message = message.removeprefix("Value error, ")
    return BadRequest(f"Invalid value for '{param}': {message}" if param else message, param=param)
