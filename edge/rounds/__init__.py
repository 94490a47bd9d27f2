"""Rounds: one executor per kind of round, each run by edge/generation.py with one RoundContext
(context.py); what a round did is edge/record.py's RoundRecord:

  local.py       tokens committed unverified: a fast-mode skip, or a stretch while the
                 verifier is away
  sequential.py  one block sent and its verdict awaited (re-opening as needed)
  pipelined.py   draft-ahead and send-ahead on top of the sequential round
  cloud.py       the verifier generates tokens itself (cloud-generates)

The record lives at the ground floor (edge/record.py), so the policies (edge/control/) and
state.py read it without importing this package.
"""
