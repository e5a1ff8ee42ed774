"""deploy/grafana/dashboards/panpriv-roles.json: the Encode–Shuffle–Analyze and scale-out roles'
dashboard. Its queries are valid PromQL (promtool), every metric it reads is one those roles export
(names read from their metrics classes' own exposition), every query is filtered by the instance
variable, its job filters name the Prometheus jobs that scrape those roles, and it uses the
provisioned datasource like the service's dashboard."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.esa.metrics import AnalyzerMetrics, ShufflerMetrics
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.scaleout.metrics import CoordinatorMetrics, WorkerMetrics
from tests.deploy.conftest import exported_names
from tests.deploy.test_stack import (
    DEPLOY,
    PROMETHEUS_CONFIG,
    PROMETHEUS_SYNTHETIC,
    as_promql,
    load_yaml,
    promql_metric_names,
    run_promtool,
)

ROLES_DASHBOARD = DEPLOY / "grafana" / "dashboards" / "panpriv-roles.json"


def queries() -> list[str]:
    panels = json.loads(ROLES_DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def role_expositions() -> dict[str, str]:
    """The /metrics page of each of the four roles, from their own classes, every labelled family set."""
    guarantee = Guarantee(1.0, 1e-6)
    report = PrivacyReport("composed", 1, guarantee, guarantee)
    analyzer, worker = AnalyzerMetrics(["stale_round"]), WorkerMetrics()
    for metrics in (analyzer, worker):  # the labelled privacy gauges appear once set
        metrics.observe_privacy(report, {"source": (guarantee, guarantee)})
    pages = {}
    for metrics in (analyzer, ShufflerMetrics(["late"]), worker, CoordinatorMetrics()):
        metrics.set_info("role", "deployment", "version")
        pages[type(metrics).__name__] = generate_latest(metrics.registry).decode()
    return pages


def role_metric_names() -> set[str]:
    """Every sample name the four roles can export, from their own classes' exposition."""
    return set().union(*map(exported_names, role_expositions().values()))


def run_exposition() -> str:
    """``panpriv run``'s page with every family set, the hold-out's included (a real process's page
    is checked in tests/deploy/test_stack.py; this one has the families a Kafka run without
    --holdout leaves empty)."""
    metrics = ServiceMetrics()
    metrics.set_info("pan-acsa", "file:records.jsonl", "0")
    guarantee = Guarantee(1.0, 1e-6)
    metrics.observe_privacy(PrivacyReport("composed", 1, guarantee, guarantee))
    metrics.observe_budget({"source": (guarantee, guarantee)})
    metrics.set_epsilon_budget(2.0)
    metrics.observe_lag({"events/0": 3})
    metrics.observe_holdout({"auc": 0.8, "accuracy": 0.7, "records": 800})
    return generate_latest(metrics.registry).decode()


@pytest.mark.parametrize("role", ["AnalyzerMetrics", "ShufflerMetrics", "WorkerMetrics", "CoordinatorMetrics", "run"])
def test_promtool_accepts_every_roles_metrics_with_the_process_collectors(promtool: str, role: str) -> None:
    page = run_exposition() if role == "run" else role_expositions()[role]
    result = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= exported_names(page), role


def test_every_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    rules = {"groups": [{"name": "roles", "rules": [
        {"record": f"roles:query_{i}", "expr": as_promql(expr)} for i, expr in enumerate(queries())
    ]}]}
    path = tmp_path / "roles_rules.yml"
    path.write_text(json.dumps(rules))
    assert f"SUCCESS: {len(queries())} rules found" in run_promtool(promtool, "check", "rules", str(path))


def test_every_metric_is_exported_by_a_role() -> None:
    exported = role_metric_names()
    used = set().union(*map(promql_metric_names, queries()))
    assert used - exported - PROMETHEUS_SYNTHETIC == set(), sorted(exported)
    # Each role has a panel.
    for prefix in ("panpriv_esa_rounds", "panpriv_esa_shuffler_", "panpriv_scaleout_worker_", "panpriv_scaleout_coordinator_"):
        assert any(name.startswith(prefix) for name in used), prefix


def test_queries_are_filtered_by_instance_and_name_the_scrape_jobs() -> None:
    dashboard = json.loads(ROLES_DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == load_yaml(
        DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"][0]["uid"]
    assert "panpriv_esa_info" in variables["instance"]["query"]["query"]
    assert "panpriv_scaleout_info" in variables["instance"]["query"]["query"]
    jobs = {job["job_name"] for job in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]}
    for query in queries():
        selectors = re.findall(r"panpriv_\w+(\{[^}]*\})?", query)
        assert selectors and all('instance=~"$instance"' in s for s in selectors), query
        assert set(re.findall(r'job="([^"]+)"', query)) <= jobs, query
    uids = {target["datasource"]["uid"] for panel in dashboard["panels"] for target in panel.get("targets", [])}
    assert uids == {"${datasource}"}
