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
- keys: the one-shot keygens write the analyzer's key pair into ``esa-keys`` and the shuffler's into
  ``esa-shuffler-keys``, each copying the public files into ``esa-public``; each private volume is
  mounted, read-only, into its own role only (the analyzer never sees the shuffler's key, the
  shuffler never the analyzer's); the analyzer reads the shuffler's verify key from ``esa-public``;
  the image creates the private directories owned by the service user with mode 0700;
  ``keygen --if-missing`` writes a 0600 key once and then leaves the directory alone;
- the roles reach the broker on its SASL listener as their own principals (the Kafka ACLs:
  tests/deploy/test_esa_acls.py);
- the analyzer's checkpoint and budget store are on its named volume;
- both roles serve metrics on the image's health-check port, which Prometheus scrapes under the
  compose service names; the budget alert's series are exported by the analyzer;
- the analyzer's ``--max-epsilon`` admits one use of a round and refuses a second — of the statement
  it charges, whose intrusion guarantee is its output one — and the budget alert is quiet at one use
  (the ε the budget limits: finite ones, ``panpriv.accounting.budget.exceeds``).
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
from tests.deploy.test_stack import PROMETHEUS_CONFIG, advertised, alert_rules, compose, dockerfile_instructions, load_yaml


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
KEYGENS = ("esa-keygen", "esa-shuffler-keygen")
ESA_SERVICES = (*KEYGENS, *(name for stack in STACKS for name in (stack.init, stack.shuffler, stack.analyzer)))
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
    for keygen in KEYGENS:
        assert services()[keygen]["profiles"] == [stack.profile for stack in STACKS]
        assert parsed(keygen).handler is commands.cmd_keygen and parsed(keygen).if_missing
    assert parsed("esa-shuffler-keygen").role == "shuffler" and parsed("esa-keygen").role == "analyzer"
    for name in (*KEYGENS, stack.shuffler, stack.analyzer):
        assert services()[name]["image"] == services()["panpriv"]["image"]
    assert services()[stack.init]["image"] == services()["kafka"]["image"]
    assert parsed(stack.shuffler).handler is commands.cmd_shuffle
    assert parsed(stack.analyzer).handler is commands.cmd_analyze
    for name in (stack.shuffler, stack.analyzer):
        assert services()[name]["restart"] == "on-failure"  # exit 0 (budget spent, SIGTERM) needs a person
        assert [parsed(name).bootstrap] == [advertised(services())["ESA"]], "the roles use the SASL listener"


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
        acls = services()[name]["depends_on"][f"{stack.init.removesuffix('-init')}-acls"]
        assert acls["condition"] == "service_completed_successfully", "roles start once their ACLs exist"


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
    release = summing.users * summing.shares * wire.share_unit_size(summing.dim)
    limit = re.search(r"max\.message\.bytes=(\d+)", init_script(stack))
    assert limit is not None and int(limit.group(1)) >= release + 1024, "the shuffled topic must admit a release"
    assert str(summing.shares) in (Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.yml").read_text()


def test_each_private_key_lives_in_a_volume_only_its_role_mounts(tmp_path: Path) -> None:
    analyzer_keygen, shuffler_keygen = parsed("esa-keygen"), parsed("esa-shuffler-keygen")
    assert volumes("esa-keygen")[str(analyzer_keygen.dir)] == "esa-keys"
    assert volumes("esa-shuffler-keygen")[str(shuffler_keygen.dir)] == "esa-shuffler-keys"
    public = str(analyzer_keygen.public_dir)
    assert str(shuffler_keygen.public_dir) == public
    assert volumes("esa-keygen")[public] == volumes("esa-shuffler-keygen")[public] == "esa-public"
    for stack in STACKS:
        analyzer, shuffler = parsed(stack.analyzer), parsed(stack.shuffler)
        assert str(analyzer.analyzer_keys) == str(analyzer_keygen.dir)
        assert volumes(stack.analyzer)[str(analyzer.analyzer_keys)] == "esa-keys:ro"
        assert [str(p) for p in analyzer.shuffler_verify_key] == [public] and volumes(stack.analyzer)[public] == "esa-public:ro"
        assert str(shuffler.shuffler_key) == str(shuffler_keygen.dir)
        assert volumes(stack.shuffler) == {str(shuffler_keygen.dir): "esa-shuffler-keys:ro"}, "the shuffler: its key only"
        assert "esa-shuffler-keys" not in " ".join(volumes(stack.analyzer).values()), "the analyzer never sees it"
        for keygen in KEYGENS:
            assert services()[stack.analyzer]["depends_on"][keygen]["condition"] == "service_completed_successfully"
        assert services()[stack.shuffler]["depends_on"]["esa-shuffler-keygen"]["condition"] == "service_completed_successfully"
    run = " ".join(args for name, args in dockerfile_instructions() if name == "RUN")
    for key_dir in (str(analyzer_keygen.dir), str(shuffler_keygen.dir)):
        assert key_dir in run and re.search(rf"chown panpriv:panpriv [^&]*{re.escape(key_dir)}", run)
        assert re.search(rf"chmod 0700 [^&]*{re.escape(key_dir)}", run)
    # What the keygen containers do, on a directory of this machine: a 0600 key once, then nothing;
    # the public files beside the public directory, never a private one.
    for role in ("analyzer", "shuffler"):
        args = build_parser().parse_args(["keygen", str(tmp_path / role), "--role", role, "--if-missing",
                                          "--public-dir", str(tmp_path / "public")])
        assert args.handler(args) == 0 and args.handler(args) == 0
        keys = list((tmp_path / role).glob(f"{role}-*.key"))
        assert len(keys) == 1 and stat.S_IMODE(keys[0].stat().st_mode) == 0o600
    assert sorted(p.suffix for p in (tmp_path / "public").iterdir()) == [".pub", ".pub", ".verify"]


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
    the output and the intrusion guarantee of the statement the analyzer charges, a second use adds
    the output's (basic composition)."""
    from panpriv.streamer.esa.analyzer import Analyzer

    analyzer = parsed(stack.analyzer)
    learner = analyzer_learner(stack)
    role = SumAnalyzer if analyzer.learner in SUM_LEARNERS else Analyzer
    report = role(learner, [PrivateKey.generate()], "deploy-check").report()
    finite = [g.epsilon for g in (report.output, report.intrusion) if math.isfinite(g.epsilon)]
    one = max(finite)
    two = (report.intrusion.epsilon if math.isfinite(report.intrusion.epsilon) else report.output.epsilon) + report.output.epsilon
    assert one <= analyzer.max_epsilon < two
    threshold = float(re.findall(r">\s*([0-9.]+)", next(
        r["expr"] for r in alert_rules() if r["alert"] == "PanprivPrivacyBudgetHigh"))[-1])
    assert one / analyzer.max_epsilon <= threshold, "the budget alert would fire on the first use"
    comment = (Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.yml").read_text()
    stated = f"{round(report.output.epsilon, 2):g}"
    assert f"max-epsilon {analyzer.max_epsilon:g}: one use of each round (epsilon {stated}" in comment \
        or f"max-epsilon {analyzer.max_epsilon:g} admits one use of each round (eps {stated})" in comment, \
        "the compose comment states the epsilon of one use"


@pytest.mark.parametrize("service", ESA_SERVICES)
def test_esa_named_volumes_are_declared(service: str) -> None:
    declared = set(compose()["volumes"])
    for spec in volumes(service).values():
        assert spec.split(":")[0] in declared
