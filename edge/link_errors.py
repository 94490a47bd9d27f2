"""Moved to edge/link/errors.py; this name stays for importers elsewhere."""
from edge.link.errors import *  # noqa: F401,F403
