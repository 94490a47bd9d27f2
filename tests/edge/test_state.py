"""edge/state.py: truncation of committed tokens at a stop id and at max_tokens."""
from __future__ import annotations

import pytest

from edge.state import truncate

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


def test_truncate_keeps_the_stop_id_and_drops_what_follows():
    assert truncate([5, 6, 0, 7], room=10, stop_ids=frozenset({0})) == ([5, 6, 0], "stop")


def test_truncate_at_max_tokens():
    assert truncate([5, 6, 7], room=2, stop_ids=frozenset()) == ([5, 6], "length")
    assert truncate([5, 6], room=2, stop_ids=frozenset()) == ([5, 6], "length")
    assert truncate([5], room=2, stop_ids=frozenset()) == ([5], "")
    # A stop id beyond the room does not count.
    assert truncate([5, 6, 0], room=2, stop_ids=frozenset({0})) == ([5, 6], "length")
