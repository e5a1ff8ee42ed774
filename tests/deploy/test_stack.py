"""deploy/: the stack files parse, promtool accepts them, and they agree with the service.

No Docker daemon is needed. What is checked, and against what:

- every YAML and JSON file under deploy/ parses;
- ``promtool check config`` and ``promtool check rules`` pass on the shipped files, and every
  dashboard query is valid PromQL (promtool checks them as recording rules);
- every metric name in the alert rules and the dashboard is one the service exports (names read
  from the ``exported_metric_names`` fixture in conftest.py, i.e. from a service's ``/metrics``);
- the compose file's build context, Dockerfile, bind mounts and config path exist, and the ports,
  datasource uid and provisioning paths agree across compose, Dockerfile, Prometheus and Grafana;
- deploy/panpriv.toml loads with the service's own config loader, and the topic, volume, metrics
  port, alert thresholds and load generator's records agree with it;
- the Dockerfile runs as a non-root user, health-checks the metrics endpoint, enters through the
  ``panpriv`` console script, and copies everything the project's own pyproject install needs;
- ``docker compose config`` validates the compose file where the Compose CLI is available.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from panpriv.streamer.commands.cli import build_parser
from panpriv.streamer.commands.produce import run_produce
from panpriv.streamer.config import load_config
from panpriv.streamer.io.source_url import parse_kafka_url
from tests.deploy.conftest import exported_names

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
RULES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "panpriv.json"
DOCKERFILE = DEPLOY / "Dockerfile"

# Series that Prometheus itself attaches to every scrape target; the only non-service names allowed.
PROMETHEUS_SYNTHETIC = {"up"}
# Grafana's interval variables, replaced by a duration so that promtool can parse the query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def advertised(services: dict[str, Any]) -> dict[str, str]:
    """The broker's advertised listeners by name: ``{"PLAINTEXT": "kafka:9092", ...}``."""
    pairs = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    return {name: address for name, address in (pair.split("://") for pair in pairs)}


def alert_rules() -> list[dict[str, Any]]:
    return [rule for path in RULES for group in load_yaml(path)["groups"] for rule in group["rules"]]


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def as_promql(grafana_expr: str) -> str:
    for variable, duration in GRAFANA_VARIABLES.items():
        grafana_expr = grafana_expr.replace(variable, duration)
    return grafana_expr


_PROMQL_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                    "group_right", "bool", "offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression.

    Strings, label matchers, range selectors and grouping clauses are removed; what remains are
    numbers, operators, function names (followed by "(") and keywords, and the metric names.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group()
        if word.lower() in _PROMQL_KEYWORDS or text[match.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def test_metric_name_extraction_sees_names_and_skips_functions_labels_and_keywords() -> None:
    expr = ('sum by (reason) (rate(panpriv_records_rejected_total{reason="nan_or_inf"}[5m])) '
            '/ on (instance) group_left () up > 1e-3 and time() - panpriv_x offset 5m')
    assert promql_metric_names(expr) == {"panpriv_records_rejected_total", "up", "panpriv_x"}
    assert promql_metric_names('histogram_quantile(0.99, sum by (le) (rate(a_bucket[1m])))') == {"a_bucket"}


# --- every file parses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", sorted([*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")]), ids=lambda p: str(p.relative_to(DEPLOY))
)
def test_yaml_parses_to_a_mapping(path: Path) -> None:
    assert isinstance(load_yaml(path), dict)


@pytest.mark.parametrize("path", sorted(DEPLOY.rglob("*.json")), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_json_parses_to_an_object(path: Path) -> None:
    assert isinstance(json.loads(path.read_text()), dict)


# --- promtool ---------------------------------------------------------------------------------


def run_promtool(promtool: str, *args: str) -> str:
    result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_promtool_accepts_the_prometheus_config_and_finds_the_rules(promtool: str) -> None:
    out = run_promtool(promtool, "check", "config", str(PROMETHEUS_CONFIG))
    assert f"SUCCESS: {len(RULES)} rule files found" in out


def test_promtool_accepts_the_alert_rules(promtool: str) -> None:
    out = run_promtool(promtool, "check", "rules", *map(str, RULES))
    assert f"SUCCESS: {len(alert_rules())} rules found" in out


def test_every_dashboard_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    queries = dashboard_queries()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": as_promql(expr)} for i, expr in enumerate(queries)
    ]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps(rules))
    out = run_promtool(promtool, "check", "rules", str(path))
    assert f"SUCCESS: {len(queries)} rules found" in out


# --- the names agree with the service -----------------------------------------------------------


@pytest.mark.integration
def test_rule_and_dashboard_metrics_are_exported_by_the_service(exported_metric_names: set[str]) -> None:
    used = {name: source
            for source, exprs in (("rules", [r["expr"] for r in alert_rules()]), ("dashboard", dashboard_queries()))
            for expr in exprs for name in promql_metric_names(expr)}
    unknown = {name: source for name, source in used.items() if name not in exported_metric_names | PROMETHEUS_SYNTHETIC}
    assert unknown == {}, f"not exported by the service: {unknown}; it exports {sorted(exported_metric_names)}"


@pytest.mark.integration
def test_promtool_accepts_the_running_services_metrics_with_the_process_collectors(promtool: str, service_exposition: str) -> None:
    """``promtool check metrics`` (format and naming lint) on the page a real ``panpriv run`` serves,
    which carries prometheus-client's process and platform collectors beside its own families."""
    result = subprocess.run([promtool, "check", "metrics"], input=service_exposition, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
    names = exported_names(service_exposition)
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "python_info"} <= names


def test_dashboard_shows_every_required_view() -> None:
    queries = dashboard_queries()
    used = set().union(*map(promql_metric_names, queries))
    assert {
        "panpriv_records_total", "panpriv_records_rejected_total", "panpriv_batch_duration_seconds_bucket",
        "panpriv_last_checkpoint_timestamp_seconds", "panpriv_consumer_lag_records",
        "panpriv_privacy_epsilon", "panpriv_privacy_delta", "panpriv_snapshots_total",
    } <= used
    # Rejects split by reason; latency as quantiles; both guarantees shown for ε and δ.
    assert any("by (reason)" in q and "panpriv_records_rejected_total" in q for q in queries)
    assert {q.split(",")[0] for q in queries if q.startswith("histogram_quantile")
            and "panpriv_batch_duration_seconds_bucket" in q} >= {"histogram_quantile(0.5", "histogram_quantile(0.99"}
    for metric in ("panpriv_privacy_epsilon", "panpriv_privacy_delta"):
        for guarantee in ("output", "intrusion"):
            assert any(f'{metric}{{guarantee="{guarantee}", ' in q for q in queries), (metric, guarantee)
    assert any("by (topic, partition)" in q and "panpriv_consumer_lag_records" in q for q in queries)
    # The budget store: ε over every run per data source, against max_epsilon, and the share spent.
    assert any("by (source, guarantee)" in q and "panpriv_budget_epsilon" in q for q in queries)
    assert any("panpriv_privacy_epsilon_budget" in q and "panpriv_budget_epsilon" not in q and "/" not in q for q in queries)
    assert any("/ panpriv_privacy_epsilon_budget" in q for q in queries)


def test_dashboard_has_datasource_and_instance_variables_used_by_every_query() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["query"]["query"] == "label_values(panpriv_info, instance)"
    for query in dashboard_queries():
        selectors = re.findall(r"panpriv_\w+(\{[^}]*\})?", query)
        assert selectors and all('instance=~"$instance"' in s for s in selectors), query


def test_alert_rules_cover_the_required_conditions() -> None:
    by_name = {rule["alert"]: rule for rule in alert_rules()}
    assert set(by_name) == {"PanprivServiceDown", "PanprivNoRecordsProcessed", "PanprivRejectedRateHigh",
                            "PanprivCheckpointStale", "PanprivPrivacyBudgetHigh", "PanprivSeededMode",
                            "PanprivRoleDown", "PanprivConsumerLagGrowing"}
    assert 'up{job="panpriv"} == 0' in by_name["PanprivServiceDown"]["expr"]
    for rule in by_name.values():
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


# --- compose, Dockerfile, provisioning agree with each other and with the tree ------------------


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of each bind mount (``./…`` sources) of a compose service."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts[target] = (COMPOSE.parent / source).resolve()
    return mounts


def test_compose_build_context_dockerfile_and_bind_mounts_exist() -> None:
    services = compose()["services"]
    build = services["panpriv"]["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == REPO
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE
    mounted = {name: bind_mounts(service) for name, service in services.items()}
    missing = {name: str(host) for name, mounts in mounted.items() for host in mounts.values() if not host.exists()}
    assert missing == {}
    assert mounted["prometheus"]["/etc/prometheus"] == PROMETHEUS_CONFIG.parent
    assert mounted["grafana"]["/etc/grafana/provisioning"] == DEPLOY / "grafana" / "provisioning"


def test_compose_named_volumes_are_declared() -> None:
    spec = compose()
    used = {volume.split(":")[0] for service in spec["services"].values() for volume in service.get("volumes", [])
            if not volume.startswith((".", "/"))}
    assert used == set(spec["volumes"])
    assert "/var/lib/panpriv" in [v.split(":")[1] for v in spec["services"]["panpriv"]["volumes"]]


def test_service_reads_the_mounted_config() -> None:
    service = compose()["services"]["panpriv"]
    command = service["command"]
    config_path = command[command.index("--config") + 1]
    host = bind_mounts(service)[config_path]
    assert host == DEPLOY / "panpriv.toml" and host.is_file()
    assert service["volumes"][0].endswith(":ro")


def test_compose_uses_apache_kafka_in_kraft_mode_and_creates_the_topic() -> None:
    services = compose()["services"]
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    # KRaft formats its storage with this id: a base64url-encoded 16-byte UUID.
    cluster_id = kafka["environment"]["CLUSTER_ID"]
    assert len(cluster_id) == 22 and len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    init = services["kafka-init"]
    assert init["depends_on"]["kafka"]["condition"] == "service_healthy"
    topic = init["command"][init["command"].index("--topic") + 1]
    assert services["panpriv"]["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert topic in services["loadgen"]["command"]
    assert services["loadgen"]["profiles"] == ["load"]


def test_grafana_provisioning_matches_the_compose_mounts_and_the_dashboard() -> None:
    grafana = compose()["services"]["grafana"]
    provider = load_yaml(DEPLOY / "grafana/provisioning/dashboards/panpriv.yml")["providers"][0]
    assert bind_mounts(grafana)[provider["options"]["path"]] == DASHBOARD.parent
    datasource = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {target["datasource"]["uid"] for panel in dashboard["panels"] for target in panel.get("targets", [])}
    assert uids == {"${datasource}"}  # the variable, whose default is the provisioned datasource
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "datasource")
    assert variable["current"]["value"] == datasource["uid"]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_dockerfile_runs_as_non_root_through_the_panpriv_entry_point_with_a_healthcheck() -> None:
    instructions = dockerfile_instructions()
    users = [args for name, args in instructions if name == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert json.loads(dict(instructions)["ENTRYPOINT"]) == ["panpriv"]
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["panpriv"] == "panpriv.streamer.commands.cli:main"
    health = dict(instructions)["HEALTHCHECK"]
    assert "/metrics" in health and "PANPRIV_METRICS_PORT" in health


def test_dockerfile_copies_everything_the_projects_own_install_needs() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    copied = {Path(src.rstrip("/")) for name, args in dockerfile_instructions() if name == "COPY"
              and not args.startswith("--from") for src in args.split()[:-1]}
    needed = {Path("pyproject.toml"), Path(pyproject["project"]["readme"])}
    needed |= {Path(name) for name in pyproject["project"].get("license-files", [])}
    # Package discovery: `include = ["panpriv*"]` names the top-level package; its parts are links
    # to top-level folders (panpriv/accounting -> ../accounting), and the link targets must be copied too.
    packages = {Path(pattern.rstrip("*")) for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed |= packages
    needed |= {link.resolve().relative_to(REPO) for package in packages
               for link in (REPO / package).iterdir() if link.is_symlink()}
    assert needed <= copied
    assert all((REPO / path).exists() for path in copied)
    # Package data (the bundled dataset) lives inside a copied package: panpriv.streamer -> streamer/.
    for package in pyproject["tool"]["setuptools"]["package-data"]:
        folder = (REPO / package.replace(".", "/")).resolve().relative_to(REPO)
        assert folder in copied or folder.parts[0] in {str(c) for c in copied}
    assert any(name == "RUN" and "pip wheel" in args and " ." in args for name, args in dockerfile_instructions())
    # The build context sends only what the .dockerignore lets through (`*`, then `!path` lines).
    allowed = {Path(line[1:].rstrip("/")) for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines() if line.startswith("!")}
    assert copied <= allowed, f"copied but left out of the build context: {sorted(map(str, copied - allowed))}"


# --- the service's config (deploy/panpriv.toml) agrees with the stack ----------------------------


def service_config():
    return load_config(DEPLOY / "panpriv.toml")


def test_service_config_loads_with_the_services_own_loader() -> None:
    config = service_config()
    assert config.learner.name == "pan-acsa"
    # A Kafka topic has no end: the public stream length must be stated.
    assert config.learner.n is not None
    assert (config.records.format, config.records.dim, config.records.feature_bound) == ("json", 20, 1.0)


def test_metrics_port_agrees_across_config_dockerfile_and_prometheus() -> None:
    config = service_config()
    env = dict(dockerfile_instructions())["ENV"]
    image_port = int(re.search(r"PANPRIV_METRICS_PORT=(\d+)", env).group(1))
    assert str(image_port) in dict(dockerfile_instructions())["EXPOSE"].split()
    scrape = next(job for job in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"] if job["job_name"] == "panpriv")
    assert scrape["dns_sd_configs"][0]["names"] == ["panpriv"]
    assert scrape["dns_sd_configs"][0]["port"] == image_port == config.metrics.port
    # Reachable from the Prometheus container (not only from inside the service's container).
    assert config.metrics.addr == "0.0.0.0"


def test_service_reads_the_initialised_topic_and_writes_to_its_volume() -> None:
    config = service_config()
    services = compose()["services"]
    url = parse_kafka_url(config.source.url)
    init = services["kafka-init"]["command"]
    assert url.topics == [init[init.index("--topic") + 1]]
    assert url.bootstrap == [advertised(services)["PLAINTEXT"]]
    volumes = dict(v.split(":")[:2][::-1] for v in services["panpriv"]["volumes"])
    assert volumes[str(config.out)] == "panpriv-data"


def test_load_generator_writes_records_the_service_accepts() -> None:
    config = service_config()
    command = compose()["services"]["loadgen"]["command"]
    args = build_parser().parse_args(command)  # the image's entry point is `panpriv`
    assert args.handler is run_produce
    assert (args.format, args.dim) == (config.records.format, config.records.dim)
    assert [args.bootstrap] == parse_kafka_url(config.source.url).bootstrap


def rule_threshold(alert: str) -> float:
    """The number after the last '>' of an alert's expression (its threshold)."""
    expr = next(rule["expr"] for rule in alert_rules() if rule["alert"] == alert)
    return float(re.findall(r">\s*([0-9.]+)", expr)[-1])


def test_alert_thresholds_follow_the_service_config() -> None:
    config = service_config()
    checkpoint_expr = next(r["expr"] for r in alert_rules() if r["alert"] == "PanprivCheckpointStale")
    age_threshold = float(re.search(r"panpriv_last_checkpoint_timestamp_seconds\s*>\s*([0-9.]+)", checkpoint_expr).group(1))
    assert age_threshold == 2 * config.checkpoint.every_seconds
    # The budget alert reads max_epsilon from the service (panpriv_privacy_epsilon_budget), not a copy.
    budget_expr = next(r["expr"] for r in alert_rules() if r["alert"] == "PanprivPrivacyBudgetHigh")
    assert "/ panpriv_privacy_epsilon_budget" in budget_expr and rule_threshold("PanprivPrivacyBudgetHigh") == 0.8
    assert config.learner.max_epsilon is not None


# --- docker compose -----------------------------------------------------------------------------


def test_docker_compose_config_validates() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI on this machine; `docker compose config` not run")
    version = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30)
    if version.returncode != 0:
        daemon = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
        state = "a Docker daemon answers" if daemon.returncode == 0 else "no Docker daemon answers"
        pytest.skip(f"the Docker Compose plugin is not installed ({version.stderr.strip()!r}) and {state}; "
                    "`docker compose config` not run")
    result = subprocess.run([docker, "compose", "-f", str(COMPOSE), "config", "--quiet"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_scaleout_workers_and_coordinator_agree_on_topics_and_parse() -> None:
    """`--profile scaleout --scale worker=K`: the worker and coordinator commands are valid
    `panpriv` commands, read the initialised records topic, and share the topics scaleout-init
    creates (gradients: one partition; model and budget: compacted); Prometheus scrapes both roles
    on the image's health-check port."""
    from panpriv.streamer.commands.scaleout import cmd_coordinate, cmd_worker

    services = compose()["services"]
    worker, coordinator, init = services["worker"], services["coordinator"], services["scaleout-init"]
    assert worker["profiles"] == coordinator["profiles"] == init["profiles"] == ["scaleout"]
    assert "container_name" not in worker and "ports" not in worker  # `--scale` needs neither
    command = [part.replace("${PANPRIV_WORKERS:-3}", "3") for part in coordinator["command"]]
    w, c = build_parser().parse_args(worker["command"]), build_parser().parse_args(command)
    assert (w.handler, c.handler) == (cmd_worker, cmd_coordinate)
    records = services["kafka-init"]["command"]
    assert w.data_topic == records[records.index("--topic") + 1]
    assert (w.gradients_topic, w.model_topic, w.deployment) == (c.gradients_topic, c.model_topic, c.deployment)
    script = init["command"][0]
    assert f"--topic {w.gradients_topic} --partitions 1" in script
    assert f"--topic {w.model_topic} --partitions 1 --replication-factor 1 --config cleanup.policy=compact" in script
    budget = w.budget_kafka.removeprefix(f"kafka://{w.bootstrap}/")  # the store on the roles' own brokers
    assert f"--topic {budget} --partitions 1 --replication-factor 1 --config cleanup.policy=compact" in script
    assert [w.bootstrap] == [c.bootstrap] == [advertised(services)["PLAINTEXT"]]
    # Both roles serve /metrics on the image's health-check port, and Prometheus scrapes every replica there.
    image_port = int(re.search(r"PANPRIV_METRICS_PORT=(\d+)", dict(dockerfile_instructions())["ENV"]).group(1))
    jobs = {job["job_name"]: job for job in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]}
    for service, parsed in (("worker", w), ("coordinator", c)):
        assert parsed.metrics_port == image_port and parsed.metrics_addr == "0.0.0.0"
        sd = jobs[f"panpriv-{service}"]["dns_sd_configs"][0]
        assert sd["names"] == [service] and sd["port"] == image_port
