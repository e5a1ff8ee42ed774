"""deploy/: the Kafka ACLs of the Encode–Shuffle–Analyze stacks give each role only the topics it
needs — statically, from the compose file, no broker (docs/privacy.md, "Who reads what").

Checked, per stack: the broker enforces ACLs (StandardAuthorizer) and authenticates the ESA roles on
their own SASL listener, one principal per role and stack, each declared with a password; the
shuffler and the analyzer connect there as their principals (their environment loads with the
service's own ``[kafka]`` loader); the ACL init container runs after the topics exist and before the
roles start; and the ACLs it adds are exactly those of
:func:`panpriv.streamer.esa.deployment.topic_access` on the topics the roles' commands name — a role
reads (Read, Describe) and writes (Write, Describe) nothing else, the shuffler also commits its
consumer group's offsets (Read on its group), the analyzer has no right on the messages topic, and
no ACL names a wildcard or grants ``All``.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from typing import Any

import pytest

from panpriv.streamer.config import load_kafka_config
from panpriv.streamer.esa.deployment import topic_access
from tests.deploy.test_esa_stack import STACKS, Stack, parsed, per_stack, services

OPERATIONS = {"read": {"Read", "Describe"}, "write": {"Write", "Describe"}}


def acl_service(stack: Stack) -> str:
    return f"{stack.init.removesuffix('-init')}-acls"


def granted(stack: Stack) -> dict[str, set[tuple[str, str, str]]]:
    """principal → {(resource type, name, operation)} the stack's ACL init container adds."""
    script = " ".join(services()[acl_service(stack)]["command"])
    rights: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for line in script.split(";"):
        if "--allow-principal" not in line:
            continue
        words = shlex.split(line.replace("$$acl", "").replace("$acl", ""))
        principal = words[words.index("--allow-principal") + 1].removeprefix("User:")
        operations = [words[i + 1] for i, word in enumerate(words) if word == "--operation"]
        kind = "topic" if "--topic" in words else "group"
        name = words[words.index(f"--{kind}") + 1]
        assert words.count(f"--{kind}") == 1 and "--deny-principal" not in words
        rights[principal] |= {(kind, name, operation) for operation in operations}
    return dict(rights)


def principal(service: str) -> str:
    return str(services()[service]["environment"]["PANPRIV_KAFKA__SASL_USERNAME"])


def expected(stack: Stack) -> dict[str, set[tuple[str, str, str]]]:
    """What :func:`topic_access` gives each role of ``stack``, on the topics its commands name."""
    shuffler, analyzer = parsed(stack.shuffler), parsed(stack.analyzer)
    topics = {"messages": shuffler.messages_topic, "shuffled": shuffler.shuffled_topic, "model": analyzer.model_topic}
    principals = {"shuffler": principal(stack.shuffler), "analyzer": principal(stack.analyzer),
                  "client": principal(stack.shuffler).removesuffix("-shuffler") + "-client"}
    out: dict[str, set[tuple[str, str, str]]] = {}
    for role, access in topic_access(checkin=False).items():
        out[principals[role]] = {("topic", topics[kind], operation) for how, kinds in access.items()
                                 for kind in kinds for operation in OPERATIONS[how]}
    out[principals["shuffler"]].add(("group", shuffler.group, "Read"))
    return out


@per_stack
def test_each_role_gets_exactly_the_topics_it_needs(stack: Stack) -> None:
    rights, wanted = granted(stack), expected(stack)
    assert rights == wanted
    analyzer = principal(stack.analyzer)
    assert not any(name == parsed(stack.shuffler).messages_topic for _, name, _ in rights[analyzer]), \
        "the analyzer cannot read the messages topic"
    for entries in rights.values():
        assert all(name != "*" and operation != "All" for _, name, operation in entries)


def test_the_stacks_share_no_principal_or_topic_right() -> None:
    owners: dict[tuple[str, str], set[str]] = defaultdict(set)
    for stack in STACKS:
        for who, entries in granted(stack).items():
            for kind, name, _ in entries:
                owners[(kind, name)].add(who)
    principals = [set(granted(stack)) for stack in STACKS]
    assert not set.intersection(*principals), "one principal per role and stack"
    for stack, others in zip(STACKS, reversed(STACKS), strict=True):
        assert not {name for _, name, _ in set().union(*granted(others).values())} & {
            parsed(stack.shuffler).messages_topic, parsed(stack.shuffler).shuffled_topic}


def test_the_broker_enforces_acls_and_authenticates_every_principal() -> None:
    env = services()["kafka"]["environment"]
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    protocols = dict(pair.split(":") for pair in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols["ESA"] == "SASL_PLAINTEXT" and env["KAFKA_LISTENER_NAME_ESA_SASL_ENABLED_MECHANISMS"] == "PLAIN"
    declared = set(re.findall(r"user_([\w-]+)=", env["KAFKA_LISTENER_NAME_ESA_PLAIN_SASL_JAAS_CONFIG"]))
    assert declared == {who for stack in STACKS for who in granted(stack)}


@per_stack
def test_the_roles_connect_as_their_principals_after_their_acls(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    for service in (stack.shuffler, stack.analyzer):
        environment: dict[str, Any] = services()[service]["environment"]
        for name, value in environment.items():
            monkeypatch.setenv(name, re.sub(r"\$\{[^:}]+:-([^}]*)\}", r"\1", str(value)))
        config = load_kafka_config()
        assert config.security_protocol == "SASL_PLAINTEXT" and config.sasl_mechanism == "PLAIN"
        assert config.sasl_username == principal(service) and config.password()
        assert services()[service]["depends_on"][acl_service(stack)]["condition"] == "service_completed_successfully"
        for name in environment:
            monkeypatch.delenv(name)
    assert services()[acl_service(stack)]["depends_on"][stack.init]["condition"] == "service_completed_successfully"
    assert services()[acl_service(stack)]["profiles"] == [stack.profile]
