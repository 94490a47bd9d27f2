"""The link to the verifier: everything between the round loop and the wire.

  channel.py    the gRPC channel and its call metadata (API key, TLS, keepalive)
  stream.py     one Session call as send / receive-with-deadline
  errors.py     what a failed call means (outage, overloaded, misconfigured) and every error
                class of the client
  verifier.py   VerifierLink: one generation's session (open, send, await, byte counts)
  wait.py       the WaitRule of every wait on the verifier (late is not down)
  deadlines.py  the RTT estimator and the late deadline every online wait uses
  breaker.py    the circuit breaker that declares the verifier away and paces probes
  offline.py    the offline policy: the request's offline mode over the two above
  reconnect.py  opening with retries and backoff, and what an unreachable verifier means for
                the request (its offline mode)
  monitor.py    the background link monitor (is the verifier there?)
"""
from edge.link.channel import api_key, call_metadata, channel_options, make_channel
from edge.link.errors import Evicted, Stopped
from edge.link.verifier_link import Sent, VerifierLink, check_verdict
from edge.link.wait import STOP_POLL_S, WaitRule

__all__ = ["STOP_POLL_S", "Evicted", "Sent", "Stopped", "VerifierLink", "WaitRule", "api_key",
           "call_metadata", "channel_options", "check_verdict", "make_channel"]
