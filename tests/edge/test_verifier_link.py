"""edge/link/verifier_link.py: a verdict is checked against the round it answers (round, accepted
length, context length, vocabulary) before the edge applies it."""
from __future__ import annotations

import pytest

from edge.link.errors import ProtocolError
from edge.link.verifier_link import check_verdict
from tandem.v1 import decoding_pb2 as pb

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


def limits(**kw) -> pb.Limits:
    return pb.Limits(**kw)


def test_check_verdict_accepts_a_consistent_verdict():
    check_verdict(pb.Verdict(round=3, accepted=2, token=9, context_length=13), 3, 10, 4,
                  limits(vocab_size=100))


@pytest.mark.parametrize("verdict, why", [
    (pb.Verdict(round=2, accepted=1, token=9, context_length=12), "round"),
    (pb.Verdict(round=3, accepted=5, token=9, context_length=16), "accepted"),
    (pb.Verdict(round=3, accepted=1, token=9, context_length=13), "context length"),
    (pb.Verdict(round=3, accepted=1, token=100, context_length=12), "vocabulary"),
])
def test_check_verdict_refuses_an_inconsistent_verdict(verdict, why):
    with pytest.raises(ProtocolError, match=why):
        check_verdict(verdict, 3, 10, 4, limits(vocab_size=100))
