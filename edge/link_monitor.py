"""Moved to edge/link/monitor.py; this name stays for importers elsewhere."""
from edge.link.monitor import *  # noqa: F401,F403
