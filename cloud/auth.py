"""API-key authentication as a gRPC server interceptor.

A call carries its key in metadata, as `x-api-key: KEY` or `authorization: Bearer KEY`. No key
is UNAUTHENTICATED, a key that is not accepted is PERMISSION_DENIED. The standard health service
stays open so that load balancers and orchestrators can probe without a key.
"""
from __future__ import annotations

import hmac
from collections.abc import Iterable

import grpc

API_KEY_HEADER = "x-api-key"
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)


def key_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    for name, value in metadata or ():
        value = value.decode() if isinstance(value, bytes) else value
        if name == API_KEY_HEADER and value:
            return value
        if name == "authorization" and value.lower().startswith("bearer "):
            return value[len("bearer "):].strip() or None
    return None


class ApiKeyInterceptor(grpc.ServerInterceptor):
    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = tuple(key.encode() for key in keys)
        assert self._keys, "an ApiKeyInterceptor without keys would refuse everything"

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(EXEMPT_PREFIXES):
            return handler
        key = key_from_metadata(handler_call_details.invocation_metadata)
        if key is None:
            return _refusing(handler, grpc.StatusCode.UNAUTHENTICATED,
                             f"missing API key: send metadata '{API_KEY_HEADER}: KEY' or "
                             "'authorization: Bearer KEY'")
        # Compare against every key in constant time, so timing tells nothing about a key.
        if not any([hmac.compare_digest(key.encode(), accepted) for accepted in self._keys]):
            return _refusing(handler, grpc.StatusCode.PERMISSION_DENIED, "API key not accepted")
        return handler


def _refusing(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str):
    """A handler of the same kind as `handler` that aborts every call before running it."""
    def refuse(_request_or_iterator, context):
        context.abort(code, message)

    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return factory(refuse, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)
