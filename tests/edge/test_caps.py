"""edge/caps.py: the block length a round may draft (max_tokens, the verifier's limits) and
the caps the edge reads off the verifier's Limits, tighter of both sides."""
from __future__ import annotations

import pytest

from edge.caps import Caps, block_length
from tandem.v1 import decoding_pb2 as pb

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


def limits(**kw) -> pb.Limits:
    return pb.Limits(**kw)


def test_block_length_never_drafts_past_max_tokens():
    assert block_length(4, remaining=10, context_length=5) == 4
    assert block_length(4, remaining=3, context_length=5) == 2
    # One token left: k = 0, the verdict's token is the target's plain next token.
    assert block_length(4, remaining=1, context_length=5) == 0


def test_block_length_respects_server_limits():
    assert block_length(8, 100, 5, max_draft_length=3) == 3
    assert block_length(8, 100, 5, max_draft_length=0) == 0  # a server that takes no drafts
    # The round takes the context to start + n + 1 <= max_context.
    assert block_length(8, 100, 10, max_context=14) == 3
    assert block_length(8, 100, 13, max_context=14) == 0
    assert block_length(8, 100, 14, max_context=14) is None


class _Link:
    def __init__(self, limits: pb.Limits | None = None, q_codec: object | None = None) -> None:
        self.limits = limits
        self.q_codec = q_codec


def test_caps_use_the_coded_q_cap_when_the_session_codes_q():
    coded = Caps(_Link(q_codec=object()), n_ctx=512, max_q_entries=16, coded_q_entries=24)
    assert coded.q_entries_cap() == 24 and coded.q_entries_cap(8) == 8  # a plan may lower it
    assert Caps(_Link(), n_ctx=512, max_q_entries=16,
                coded_q_entries=24).q_entries_cap() == 16


def test_caps_without_limits_leave_the_edge_its_own_bounds():
    caps = Caps(_Link(), n_ctx=512, max_q_entries=32)
    assert caps.max_draft_length is None and caps.max_k(100, 5, 8) == 8
    assert caps.max_context == 512 and caps.max_k(100, 512) is None
    assert (caps.q_entries_cap(), caps.q_entries_cap(8), caps.vocab(100)) == (32, 8, 100)
    assert (caps.window(4), caps.generate_tokens) == (1, 0)


def test_caps_read_zero_as_the_proto_says():
    """0: no drafts, no send-ahead, no Generate; no limit set on the context and q entries,
    the vocabulary unchecked. The same cap for a block drafted ahead as for any other."""
    caps = Caps(_Link(limits()), n_ctx=512, max_q_entries=32)
    assert caps.max_draft_length == 0 and caps.max_k(100, 5, 8) == 0
    assert caps.max_context == 512
    assert (caps.q_entries_cap(), caps.vocab(100), caps.window(4), caps.generate_tokens) == \
        (32, 100, 1, 0)


def test_caps_take_the_tighter_of_the_verifier_and_the_edge():
    caps = Caps(_Link(limits(max_draft_length=3, max_context=100, vocab_size=50,
                             max_q_entries=16, max_in_flight=2, max_generate_tokens=7)),
                n_ctx=64, max_q_entries=32)
    assert caps.max_k(100, 5, 8) == 3 and caps.max_context == 64
    assert caps.max_k(100, 62) == 1 and caps.max_k(100, 64) is None
    assert (caps.q_entries_cap(), caps.q_entries_cap(8), caps.vocab(100)) == (16, 8, 50)
    assert (caps.window(), caps.window(1), caps.generate_tokens) == (2, 1, 7)
