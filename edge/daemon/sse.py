"""Server-sent-event framing as OpenAI streams it: one `data: <json>` event per chunk, then
`data: [DONE]`. A failure after the stream has started cannot change the HTTP status any more,
so it is sent as an event whose data is the error body (OpenAI clients raise APIError on it)."""
from __future__ import annotations

from pydantic import BaseModel

DONE = b"data: [DONE]\n\n"


def event(payload: BaseModel) -> bytes:
    return b"data: " + payload.model_dump_json().encode("utf-8") + b"\n\n"
