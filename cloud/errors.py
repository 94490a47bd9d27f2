"""Domain errors of the verifier. The plain classes raise these; only the gRPC servicer maps
them to status codes (`status_code_name`), so the engine never imports grpc."""
from __future__ import annotations


class CloudError(Exception):
    """Base class: a request the verifier refuses. The message is shown to the client as is."""

    code = "INTERNAL"  # name of the grpc.StatusCode the servicer answers with


class InvalidRequest(CloudError):
    """Malformed input: token id out of range, block longer than the limit, bad q, bad sampling."""

    code = "INVALID_ARGUMENT"


class ZeroDraftProbability(InvalidRequest):
    """A drafted token whose own q is 0: the draft could not have sampled it."""


class ContextTooLong(CloudError):
    """The context (or the context after this round) would exceed the server's max_context."""

    code = "OUT_OF_RANGE"


class SessionNotFound(CloudError):
    """A Draft with no open session on the stream (never opened, closed, or evicted and gone)."""

    code = "NOT_FOUND"


class ModelNotServed(CloudError):
    """Open names a target model this server does not serve."""

    code = "NOT_FOUND"


class PreconditionFailed(CloudError):
    """State mismatch: tokenizer fingerprint differs, Draft.start disagrees, a second Open."""

    code = "FAILED_PRECONDITION"


class ResourceExhausted(CloudError):
    """The session cannot fit: too many sessions, or its KV cache alone exceeds the budget."""

    code = "RESOURCE_EXHAUSTED"


class Unavailable(CloudError):
    """The server is shutting down."""

    code = "UNAVAILABLE"


class Undecodable(InvalidRequest):
    """A message that is not a valid ClientMessage (random bytes, a truncated frame)."""


class StreamTimeout(CloudError):
    """A stream sent no Open within open_timeout_s, or nothing within idle_timeout_s."""

    code = "DEADLINE_EXCEEDED"
