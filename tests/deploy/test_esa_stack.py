"""deploy/: the Encode–Shuffle–Analyze services agree with each other, with the image, with
Prometheus, with the alert rules and with the commands they run — no Docker needed. Two stacks:
``shuffle-gaussian`` (profile ``esa``) and ``shuffle-acsa`` over secure summation (profile
``esa-acsa``: its own topics, shuffler and analyzer; the key pair is shared). Checked, per stack:

- every service is in its profile only (the key generator in both), and each command parses with
  ``panpriv``'s own parser and reaches the intended handler;
- the topics the init container creates are the ones the roles name; messages and shuffled have
  one partition, the model topic is compacted;
- the shuffler's batch size and message size (``--params``) are the analyzer learner's, and its
  ``--shares`` the secure sum's m; the shuffled topic admits a whole release;
- keys: the one-shot keygen and the analyzer share the ``esa-keys`` volume at the analyzer's
  ``--analyzer-keys`` directory, read-only for the analyzer; the shuffler mounts no key; the image
  creates that directory owned by the service user with mode 0700; ``keygen --if-missing`` writes a
  0600 key once and then leaves the directory alone;
- the analyzer's checkpoint and budget store are on its named volume;
- both roles serve metrics on the image's health-check port, which Prometheus scrapes under the
  compose service names; the budget alert's series are exported by the analyzer;
- the analyzer's ``--max-epsilon`` admits one use of a round and refuses a second, and the budget
  alert is quiet at one use (the ε the budget limits: finite ones, ``panpriv.accounting.budget.exceeds``).
"""

from __future__ import annotations

import math
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nacl.public import PrivateKey
from prometheus_client import generate_latest

from panpriv.streamer.commands import esa as commands
from panpriv.streamer.commands.cli import build_parser
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.analyzer import REJECT_REASONS
from panpriv.streamer.esa.metrics import AnalyzerMetrics
from panpriv.streamer.esa.sum_analyzer import SumAnalyzer
from panpriv.streamer.esa.sum_client import SUM_LEARNERS
from tests.deploy.conftest import exported_names
from tests.deploy.test_stack import PROMETHEUS_CONFIG, alert_rules, compose, dockerfile_instructions, load_yaml


@dataclass(frozen=True)
class Stack:
    profile: str
    init: str
    shuffler: str
    analyzer: str
    analyzer_volume: str


STACKS = (
    Stack("esa", "esa-init", "shuffler", "analyzer", "esa-analyzer-data"),
    Stack("esa-acsa", "esa-acsa-init", "shuffler-acsa", "analyzer-acsa", "esa-acsa-analyzer-data"),
)
ESA_SERVICES = ("esa-keygen", *(name for stack in STACKS for name in (stack.init, stack.shuffler, stack.analyzer)))
per_stack = pytest.mark.parametrize("stack", STACKS, ids=[stack.profile for stack in STACKS])


def services() -> dict[str, Any]:
    return compose()["services"]


def parsed(service: str) -> Any:
    return build_parser().parse_args(services()[service]["command"])  # the image's entry point is `panpriv`


def volumes(service: str) -> dict[str, str]:
    """Container path -> volume spec (``name[:ro]``) of a compose service."""
    out = {}
    for volume in services()[service].get("volumes", []):
        parts = volume.split(":")
        out[parts[1]] = ":".join([parts[0], *parts[2:]])
    return out


def init_script(stack: Stack) -> str:
    return " ".join(services()[stack.init]["command"])


def analyzer_learner(stack: Stack) -> Any:
    return commands.analyzer_learner(parsed(stack.analyzer))()


@per_stack
def test_esa_services_are_in_their_profile_only_and_run_the_intended_commands(stack: Stack) -> None:
    for name in (stack.init, stack.shuffler, stack.analyzer):
        assert services()[name]["profiles"] == [stack.profile], name
    assert services()["esa-keygen"]["profiles"] == [stack.profile for stack in STACKS]
    for name in ("esa-keygen", stack.shuffler, stack.analyzer):
        assert services()[name]["image"] == services()["panpriv"]["image"]
    assert services()[stack.init]["image"] == services()["kafka"]["image"]
    assert parsed("esa-keygen").handler is commands.cmd_keygen and parsed("esa-keygen").if_missing
    assert parsed(stack.shuffler).handler is commands.cmd_shuffle
    assert parsed(stack.analyzer).handler is commands.cmd_analyze
    for name in (stack.shuffler, stack.analyzer):
        assert services()[name]["restart"] == "on-failure"  # exit 0 (budget spent, SIGTERM) needs a person
        assert [parsed(name).bootstrap] == [services()["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
                                            .removeprefix("PLAINTEXT://")]


def test_the_stacks_share_no_topic_group_or_volume() -> None:
    """Two deployments over the same messages would be one data source charged by two analyzers."""
    for attribute in ("messages_topic", "shuffled_topic", "group"):
        assert len({getattr(parsed(stack.shuffler), attribute) for stack in STACKS}) == len(STACKS), attribute
    assert len({parsed(stack.analyzer).model_topic for stack in STACKS}) == len(STACKS)
    assert len({stack.analyzer_volume for stack in STACKS}) == len(STACKS)


@per_stack
def test_the_init_container_creates_the_topics_the_roles_name(stack: Stack) -> None:
    shuffler, analyzer = parsed(stack.shuffler), parsed(stack.analyzer)
    assert shuffler.messages_topic == analyzer.messages_topic
    assert shuffler.shuffled_topic == analyzer.shuffled_topic
    script = init_script(stack)
    loop = re.search(r"for topic in ([\w\- ]+); do (.*?); done", script)
    assert loop is not None
    assert set(loop.group(1).split()) == {shuffler.messages_topic, shuffler.shuffled_topic}
    assert "--partitions 1" in loop.group(2)
    model = re.search(rf"--topic {re.escape(analyzer.model_topic)} (.*)", script)
    assert model is not None and "--partitions 1" in model.group(1)
    assert "--config cleanup.policy=compact" in model.group(1)
    assert script.startswith("set -e;")
    for name in (stack.shuffler, stack.analyzer):
        assert services()[name]["depends_on"][stack.init]["condition"] == "service_completed_successfully"


@per_stack
def test_the_shuffler_releases_the_batches_the_analyzer_learns(stack: Stack) -> None:
    shuffler, analyzer = parsed(stack.shuffler), parsed(stack.analyzer)
    learner = analyzer_learner(stack)
    if analyzer.learner not in SUM_LEARNERS:
        assert shuffler.batch_size == analyzer.batch_size == learner.batch_size
        assert shuffler.params == learner.calibration()["params"]
        assert shuffler.shares is None
        return
    summing = SumAnalyzer(learner, [PrivateKey.generate()], "deploy-check")
    assert shuffler.batch_size == analyzer.batch_size == summing.users
    assert shuffler.params == summing.dim and shuffler.shares == summing.shares
    release = summing.users * summing.shares * wire.unit_size(summing.dim)
    limit = re.search(r"max\.message\.bytes=(\d+)", init_script(stack))
    assert limit is not None and int(limit.group(1)) >= release + 1024, "the shuffled topic must admit a release"
    assert str(summing.shares) in (Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.yml").read_text()


def test_keys_live_in_one_volume_private_to_the_analyzers(tmp_path: Path) -> None:
    keygen = parsed("esa-keygen")
    assert volumes("esa-keygen")[str(keygen.dir)] == "esa-keys"
    for stack in STACKS:
        key_dir = str(parsed(stack.analyzer).analyzer_keys)
        assert key_dir == str(keygen.dir)
        assert volumes(stack.analyzer)[key_dir] == "esa-keys:ro"
        assert "volumes" not in services()[stack.shuffler], "the shuffler holds no key"
        assert services()[stack.analyzer]["depends_on"]["esa-keygen"]["condition"] == "service_completed_successfully"
    key_dir = str(keygen.dir)
    run = " ".join(args for name, args in dockerfile_instructions() if name == "RUN")
    assert key_dir in run and re.search(rf"chown panpriv:panpriv [^&]*{re.escape(key_dir)}", run)
    assert f"chmod 0700 {key_dir}" in run
    # What the keygen container does, on a directory of this machine: a 0600 key once, then nothing.
    args = build_parser().parse_args(["keygen", str(tmp_path / "keys"), "--if-missing"])
    assert args.handler(args) == 0 and args.handler(args) == 0
    keys = list((tmp_path / "keys").glob("analyzer-*.key"))
    assert len(keys) == 1 and stat.S_IMODE(keys[0].stat().st_mode) == 0o600


@per_stack
def test_the_analyzer_keeps_its_checkpoint_and_budget_store_on_its_volume(stack: Stack) -> None:
    analyzer = parsed(stack.analyzer)
    (mount, spec), = [(m, s) for m, s in volumes(stack.analyzer).items() if s == stack.analyzer_volume]
    assert str(analyzer.out).startswith(mount + "/") and str(analyzer.state_dir).startswith(mount + "/")
    assert analyzer.max_epsilon is not None


@per_stack
def test_both_roles_are_scraped_on_the_health_check_port(stack: Stack) -> None:
    env = dict(dockerfile_instructions())["ENV"]
    image_port = int(re.search(r"PANPRIV_METRICS_PORT=(\d+)", env).group(1))
    jobs = {job["job_name"]: job for job in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]}
    for service, job in ((stack.shuffler, "panpriv-shuffler"), (stack.analyzer, "panpriv-analyzer")):
        assert parsed(service).metrics_port == image_port
        assert parsed(service).metrics_addr == "0.0.0.0"  # reachable from the Prometheus container
        sd = jobs[job]["dns_sd_configs"][0]
        assert service in sd["names"] and sd["port"] == image_port


def test_the_budget_alert_covers_the_analyzer() -> None:
    """PanprivPrivacyBudgetHigh divides panpriv_privacy_epsilon by panpriv_privacy_epsilon_budget:
    the analyzer exports both (with --max-epsilon), so the rule watches it too."""
    from panpriv.accounting.ledger import Guarantee, PrivacyReport

    metrics = AnalyzerMetrics(REJECT_REASONS)
    metrics.set_epsilon_budget(12.0)
    metrics.observe_privacy(PrivacyReport("m", 0, Guarantee(4.0, 1e-5), Guarantee(8.7, 1e-5)), {})
    names = exported_names(generate_latest(metrics.registry).decode())
    rule = next(r["expr"] for r in alert_rules() if r["alert"] == "PanprivPrivacyBudgetHigh")
    assert {"panpriv_privacy_epsilon", "panpriv_privacy_epsilon_budget"} <= names
    assert "panpriv_privacy_epsilon" in rule and "panpriv_privacy_epsilon_budget" in rule


@per_stack
def test_max_epsilon_admits_one_use_of_a_round_and_not_a_second(stack: Stack) -> None:
    """The budget limits finite ε (panpriv.accounting.budget.exceeds): one use costs the larger finite ε of
    the output and the intrusion guarantee, a second use adds the output's (basic composition)."""
    analyzer = parsed(stack.analyzer)
    report = analyzer_learner(stack).privacy()
    finite = [g.epsilon for g in (report.output, report.intrusion) if math.isfinite(g.epsilon)]
    one = max(finite)
    two = (report.intrusion.epsilon if math.isfinite(report.intrusion.epsilon) else report.output.epsilon) + report.output.epsilon
    assert one <= analyzer.max_epsilon < two
    threshold = float(re.findall(r">\s*([0-9.]+)", next(
        r["expr"] for r in alert_rules() if r["alert"] == "PanprivPrivacyBudgetHigh"))[-1])
    assert one / analyzer.max_epsilon <= threshold, "the budget alert would fire on the first use"
    if math.isfinite(report.intrusion.epsilon):
        comment = (Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.yml").read_text()
        assert f"{report.intrusion.epsilon:.3g}" in comment, "the compose comment states the local epsilon0"


@pytest.mark.parametrize("service", ESA_SERVICES)
def test_esa_named_volumes_are_declared(service: str) -> None:
    declared = set(compose()["volumes"])
    for spec in volumes(service).values():
        assert spec.split(":")[0] in declared
