"""The state of the link to the verifier, one vocabulary for the monitor, the controller's
view, the daemon (/healthz, each streamed delta's `tandem.link_state`) and its metrics.

The values are what /healthz, the streamed deltas and the `tandem_edge_link_state` gauge's
`state` label show. The link monitor (edge/link/monitor.py) probes STARTING, UP, DOWN,
OVERLOADED and MISCONFIGURED; DEGRADED (verification goes on but needed a re-open or re-sends)
is learnt from requests and rounds. A ground-floor module: it imports nothing of the project,
so control/, link/ and daemon/ all read it without an import circle.
"""
from __future__ import annotations

import enum


class LinkState(enum.StrEnum):
    # In the order the daemon's gauge lists them.
    UP = "up"
    DEGRADED = "degraded"
    DOWN = "down"                    # unreachable: tokens are generated locally, unverified
    OVERLOADED = "overloaded"        # there, but refusing sessions (RESOURCE_EXHAUSTED)
    MISCONFIGURED = "misconfigured"  # TLS, API key, tokenizer, model or target identity
    STARTING = "starting"            # not probed yet
