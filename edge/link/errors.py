"""What a failed call to the verifier means: an outage, an overloaded verifier, or a
configuration / identity error. The three need different answers:

  outage         (unreachable, reset, timed out, stalled)  -> go on locally, probe, re-open
  overloaded     (RESOURCE_EXHAUSTED)                      -> back off (the server's retry hint),
                                                              go on locally meanwhile; reported
                                                              as "verifier overloaded"
  misconfigured  (TLS, API key, tokenizer fingerprint, model name, target identity, a request
                  the verifier refuses)                    -> fail fast with a message that
                                                              names the cause; never silently
                                                              unverified

gRPC reports a TLS mismatch as UNAVAILABLE, like an outage; the details name the handshake, so
they are read here. A plaintext client talking to a TLS server only sees the connection closed:
`probe_tls` then tells the two apart by what the server answers on a raw TCP connection.

Every error class of the client lives here, once:
  raised to the caller   ClientError and its kinds: VerifierRefused (VerifierMisconfigured),
                         VerifierUnavailable, ProtocolError, CloudUnavailable
  inside the round loop  LinkDown (LinkSilent, VerifierOverloaded): reconnect / go local;
                         Evicted: re-open; Stopped: the caller stopped the generation;
                         RecvTimeout: a receive found nothing yet, the call goes on
"""
from __future__ import annotations

import enum
import re
import socket
from dataclasses import dataclass

import grpc

RETRY_AFTER_HEADER = "tandem-retry-after-ms"  # cloud.admission.RETRY_AFTER_HEADER


class FailureKind(str, enum.Enum):
    OUTAGE = "outage"
    OVERLOADED = "overloaded"
    MISCONFIGURED = "misconfigured"


@dataclass(frozen=True)
class LinkFailure:
    kind: FailureKind
    message: str                       # names the cause, for users and /healthz
    code: grpc.StatusCode | None = None
    retry_after_s: float | None = None  # overloaded: the server's hint


# "tcp handshaker shutdown" is gRPC's TCP connect giving up (a loaded host, a dropped SYN): an
# outage, not TLS (measured: 128 users on one machine read it as misconfigured and failed).
_TLS_PATTERNS = re.compile(
    r"ssl|tls|(?<!tcp )handshake|certificate|CERTIFICATE_VERIFY_FAILED|WRONG_VERSION_NUMBER|x509",
    re.I)
_AUTH_CODES = {grpc.StatusCode.UNAUTHENTICATED: "API key missing",
               grpc.StatusCode.PERMISSION_DENIED: "API key not accepted"}
_OUTAGE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                 grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED}
# A balancer between edge and verifiers (docker/nginx-grpc.conf) resets the stream when the
# verifier behind it dies mid-session: gRPC says INTERNAL "Received RST_STREAM with error code
# 2". The verifier is gone, nothing was refused: an outage (the re-open goes to another one).
_PROXY_RESET = "RST_STREAM"


def classify(code: grpc.StatusCode, details: str, retry_after_s: float | None = None
             ) -> LinkFailure:
    details = details or ""
    if code in _AUTH_CODES:
        return LinkFailure(FailureKind.MISCONFIGURED,
                           f"authentication failed: {_AUTH_CODES[code]} ({code.name}: {details})",
                           code)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return LinkFailure(FailureKind.OVERLOADED, f"verifier overloaded: {details}", code,
                           retry_after_s)
    if code == grpc.StatusCode.UNAVAILABLE and _TLS_PATTERNS.search(details):
        return LinkFailure(FailureKind.MISCONFIGURED, f"TLS handshake failed: {details}", code)
    if code in _OUTAGE_CODES or (code == grpc.StatusCode.INTERNAL and _PROXY_RESET in details):
        return LinkFailure(FailureKind.OUTAGE, f"verifier unreachable: {code.name}: {details}",
                           code)
    if code == grpc.StatusCode.FAILED_PRECONDITION and "fingerprint" in details:
        return LinkFailure(FailureKind.MISCONFIGURED, f"tokenizer mismatch ({code.name}): {details}",
                           code)
    if code == grpc.StatusCode.NOT_FOUND and "not served" in details:
        return LinkFailure(FailureKind.MISCONFIGURED, f"wrong model ({code.name}): {details}", code)
    return LinkFailure(FailureKind.MISCONFIGURED,
                       f"verifier refused the request: {code.name}: {details}", code)


def classify_rpc_error(error: grpc.RpcError, address: str | None = None,
                       tls: bool = True) -> LinkFailure:
    """Classify a failed call. With the address of a plaintext link, a connection the server
    closed at once is checked with probe_tls: a TLS server there is a configuration error."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else str(error)) or ""
    failure = classify(code, details, retry_after_from(error))
    if (failure.kind is FailureKind.OUTAGE and address and not tls
            and "Socket closed" in details and probe_tls(address)):
        return LinkFailure(FailureKind.MISCONFIGURED,
                           f"TLS mismatch: the verifier at {address} speaks TLS but this edge "
                           "connects in plaintext (set cloud.tls: true and cloud.tls_root_cert)",
                           code)
    return failure


def retry_after_from(error: grpc.RpcError) -> float | None:
    try:
        metadata = dict(error.trailing_metadata() or ())
    except Exception:  # noqa: BLE001 - not every RpcError carries metadata
        return None
    value = metadata.get(RETRY_AFTER_HEADER)
    try:
        return int(value) / 1000.0 if value is not None else None
    except (TypeError, ValueError):
        return None


def probe_tls(address: str, timeout_s: float = 1.0) -> bool | None:
    """Does the server at HOST:PORT speak TLS? Sends a plaintext HTTP/2 preface and looks at
    the answer: a TLS server answers with a TLS alert record (0x15) or closes the connection,
    an h2c server with an HTTP/2 frame. None when it cannot tell (refused, or no answer: a
    stalled server is not a TLS one)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            try:
                first = sock.recv(8)
            except socket.timeout:
                return None
            except ConnectionResetError:
                return True
            return not first or first[0] == 0x15
    except (OSError, ValueError):
        return None


class ClientError(RuntimeError):
    """Base class of what the edge client raises to its caller."""


class VerifierRefused(ClientError):
    """The verifier answered a non-retryable status (bad fingerprint, bad key, bad request)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"verifier refused: {code.name}: {details}")
        self.code = code
        self.details = details


class VerifierMisconfigured(VerifierRefused):
    """A configuration or identity error (TLS, API key, tokenizer, model, target identity):
    retrying cannot help, and generating unverified would hide it. The message names the
    cause (edge/link/errors.py)."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION
                 ) -> None:
        ClientError.__init__(self, message)
        self.code = code
        self.details = message


class VerifierUnavailable(ClientError):
    """The request wanted only verified tokens (offline "require_verified", or "wait" past its
    bound) and the verifier is not there; the message says why."""


class ProtocolError(ClientError):
    """The verifier sent something the protocol does not allow here."""


class CloudUnavailable(ClientError):
    """The verifier stayed unreachable and local generation is disabled."""


class LinkDown(Exception):
    """The stream broke or timed out; the client reconnects (internal, never escapes)."""


class LinkSilent(LinkDown):
    """Nothing came from the verifier, on the stream or to the probes the wait sent, for the
    stall bound (edge/link/wait.py WaitRule): the link is down, already probed."""


class VerifierOverloaded(LinkDown):
    """RESOURCE_EXHAUSTED: the verifier is there but full; back off for retry_after_s."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RecvTimeout(Exception):
    """recv(cancel_on_timeout=False) found nothing within its timeout; the call goes on."""


class Evicted(Exception):
    """The verifier dropped this session's state during the round (overload)."""


class Stopped(Exception):
    """The caller stopped the generation (stop event) while the link was waiting."""


class IdentityMismatch(Exception):
    """The verifier serves a different target than the one pinned or seen before."""


def check_identity(target, pinned_digest: str, seen_digest: str | None) -> None:
    """target: a tandem.v1.TargetIdentity (or None from a verifier that does not report one).
    Raises IdentityMismatch naming both targets."""
    if not pinned_digest and seen_digest is None:
        return
    if target is None or not target.digest:
        if pinned_digest:
            raise IdentityMismatch(f"wrong target: the verifier does not report its identity; "
                                   f"cloud.target_digest pins {pinned_digest}")
        return
    if pinned_digest and target.digest != pinned_digest:
        raise IdentityMismatch(f"wrong target: the verifier serves {target.name} "
                               f"({target.digest}), cloud.target_digest pins {pinned_digest}")
    if seen_digest is not None and target.digest != seen_digest:
        raise IdentityMismatch(f"wrong target: the verifier now serves {target.name} "
                               f"({target.digest}), this generation was verified by "
                               f"{seen_digest}; tokens of two targets are not mixed")
