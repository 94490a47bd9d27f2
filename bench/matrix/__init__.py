"""`tandem bench`: adaptive draft length against fixed k, the peers' rules, the cloud-only and
edge-only baselines and an oracle, per channel and device profile (see runner.py)."""
