"""Channel emulation between edge and cloud: a shaping TCP proxy driven by YAML channel profiles.

Imports neither edge nor cloud: it only moves bytes. See profile.py for the vocabulary.
"""
from sim.netem.profile import ChannelProfile, LinkSpec, OutageWindow, load_profile
from sim.netem.proxy import ChannelProxy
from sim.netem.stats import DirectionStats, ProxyStats
from sim.netem.trace import PACKET_BYTES, Trace, TraceError, load_trace, parse_trace

__all__ = ["ChannelProfile", "ChannelProxy", "DirectionStats", "LinkSpec", "OutageWindow",
           "PACKET_BYTES", "ProxyStats", "Trace", "TraceError", "load_profile", "load_trace",
           "parse_trace"]
