"""Moved to edge/link/stream.py; this name stays for importers elsewhere."""
from edge.link.stream import *  # noqa: F401,F403
