"""Moved to edge/link/offline.py (the offline policy is part of the link, not a draft policy);
this name stays for importers elsewhere."""
from edge.link.offline import *  # noqa: F401,F403
