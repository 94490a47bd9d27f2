"""`tandem capacity`: how many users one verifier on one core serves at a latency SLO, Tandem's
configurations against cloud-only and vLLM alone (bench/capacity/sweep.py has the picture)."""
