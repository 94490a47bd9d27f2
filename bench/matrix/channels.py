"""The bench's channels: where on a trace each paired unit starts, and a channel profile for a
trace the project does not ship (`--held-out-trace`).

A unit is one (prompt, offset): every configuration runs the prompt with the channel rewound to
the offset (sim.netem.ChannelProxy.rewind), so all of them meet the same stretch of the
trace, with the same jitter and loss draws.
"""
from __future__ import annotations

from pathlib import Path

from sim.netem import ChannelProfile, LinkSpec, load_profile
from tandem.config import ConfigError


def trace_period_s(profile: ChannelProfile) -> float | None:
    """The shorter period of the profile's traces (each repeats at its own); None without one."""
    periods = [spec.load_trace().period_s for spec in (profile.uplink, profile.downlink)
               if spec.trace is not None]
    return min(periods) if periods else None


def offsets_of(profile: ChannelProfile, offsets: int | tuple[float, ...]) -> list[float]:
    """Seconds into the profile's timeline at which its units start: `offsets` spread evenly
    over the trace's period (a count) or as given (a list); [0.0] for a profile without a trace
    (a constant-rate link looks the same at every offset)."""
    period = trace_period_s(profile)
    if period is None:
        return [0.0]
    if isinstance(offsets, int):
        return [round(i * period / offsets, 3) for i in range(offsets)]
    return [float(o) for o in offsets]


def trace_pair(path: Path) -> tuple[Path, Path]:
    """(uplink, downlink) trace files for a --held-out-trace PATH: PATH.up and PATH.down when
    they exist; for PATH ending in .up or .down, its sibling when it exists; otherwise PATH
    both ways."""
    if not path.is_file():
        up, down = path.with_name(path.name + ".up"), path.with_name(path.name + ".down")
        if up.is_file() and down.is_file():
            return up, down
        raise ConfigError(f"held-out trace not found: {path} (nor {up.name} and {down.name})")
    pair = {".up": ".down", ".down": ".up"}.get(path.suffix)
    other = path.with_suffix(pair) if pair else None
    if other is None or not other.is_file():
        return path, path
    return (path, other) if path.suffix == ".up" else (other, path)


def held_out_profile(path: Path, base: Path) -> ChannelProfile:
    """The `base` channel profile (delay, jitter, loss, buffer) with its capacity replaced by
    the trace at `path`, named `heldout-<trace name>`."""
    up, down = (p.resolve() for p in trace_pair(path))
    name = up.name.removesuffix(".up").removesuffix(".down")
    profile = load_profile(base)
    links = [LinkSpec(trace=str(up)), LinkSpec(trace=str(down))]
    try:
        for link in links:
            link.load_trace()  # fail now on a file that is not a mahimahi trace
    except ValueError as error:
        raise ConfigError(f"held-out trace {path}: {error}") from None
    return profile.model_copy(update={
        "name": f"heldout-{name}",
        "description": f"held-out trace {up.name} / {down.name} with {profile.name}'s "
                       f"delay {profile.delay_ms:g} ms one-way",
        "uplink": links[0], "downlink": links[1], "outages": []})
