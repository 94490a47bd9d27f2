"""Rounds: what one round did (record.py: RoundRecord, GenerationResult) and one executor per
kind of round, each run by edge/generation.py with one RoundContext (context.py):

  local.py       tokens committed unverified: a fast-mode skip, or a stretch while the
                 verifier is away
  sequential.py  one block sent and its verdict awaited (re-opening as needed)
  pipelined.py   draft-ahead and send-ahead on top of the sequential round
  cloud.py       the verifier generates tokens itself (cloud-generates)

This package's own module imports only the record, so the policies (edge/control/) can import
RoundRecord without importing the executors that call them.
"""
from edge.rounds.record import END_REASONS, GenerationResult, RoundRecord, block_record

__all__ = ["END_REASONS", "GenerationResult", "RoundRecord", "block_record"]
