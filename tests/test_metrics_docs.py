"""The metrics documentation and the Grafana dashboard name only metrics that exist: every
series in the README's metrics table and in every dashboard query is exported by the edge
daemon's or the verifier's registry (after one observation of each kind)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry
import pytest

from cloud.metrics import VerifierMetrics
from edge.daemon.metrics import DaemonMetrics

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)

ROOT = Path(__file__).resolve().parents[1]


def exported_names() -> set[str]:
    edge = DaemonMetrics(CollectorRegistry(), model="m")
    edge.observe_request("/v1/completions", 200, 0.1)
    edge.observe_rounds([4], [2], [0.01])
    edge.observe_generation(verified=3, unverified=1, target_passes=1, bytes_up=10, bytes_down=5,
                            wall_s=1.0, ttft_s=0.1, reopens=0)
    cloud = VerifierMetrics(model="m")
    cloud.watch(sessions=lambda: 1, kv_bytes=lambda: 10, kv_budget_bytes=100)
    cloud.observe_open(5)
    cloud.observe_round(4, 2, 1, 0.001, 0.01, 0.001)
    cloud.observe_end("evicted")
    cloud.observe_refusal("RESOURCE_EXHAUSTED")
    names = set()
    for text in (edge.render().decode(), cloud.render().decode()):
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name = re.split(r"[{ ]", line, maxsplit=1)[0]
                names.add(name)
                names.add(re.sub(r"_(bucket|sum|count)$", "", name))
    return names


def test_dashboard_queries_use_exported_metrics():
    names = exported_names()
    dashboard = json.loads((ROOT / "docker/grafana/dashboards/tandem.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"\btandem_[a-z_]+", target["expr"])}
    assert used and used <= names, sorted(used - names)


def test_readme_metrics_table_names_exported_metrics():
    names = exported_names()
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| metric (prefix `tandem_`)"):]
    table = table[:table.index("\n\n")]
    documented = set()
    for row in table.splitlines()[2:]:
        for cell_name in re.findall(r"`([a-z_*]+)(?:\{[^}]*\})?`", row.split("|")[1]):
            documented.add("tandem_" + cell_name)
    for name in documented:
        if name.endswith("*"):
            assert any(n.startswith(name[:-1]) for n in names), name
        else:
            assert name in names, name
    # ...and every exported family is documented.
    families = {n for n in names if not re.search(r"_(bucket|sum|count)$", n)}
    undocumented = {n for n in families if n not in documented
                    and not any(d.endswith("*") and n.startswith(d[:-1]) for d in documented)}
    assert not undocumented, sorted(undocumented)
