"""``panpriv topics create``: create topics with the layout the roles need, before they start.

Every role creates the topics it names when they are missing (:mod:`panpriv.streamer.kafka.topics`);
this command is for clusters where applications may not create topics, or to create them once
for a deployment: ``panpriv topics create --bootstrap B messages shuffled`` (one partition each)
and ``panpriv topics create --bootstrap B model --compact``. An existing topic is left alone and
its partition count printed (a role refuses a count it cannot serve, naming the topic).
"""

from __future__ import annotations

import argparse
from typing import Any

from panpriv.streamer.arg_types import positive_int
from panpriv.streamer.commands.exit_codes import EXIT_OK

HELP = "create topics with the layout the roles need (one partition; --compact for model topics)"
DESCRIPTION = (
    "Create topics before the roles start, for clusters where applications may not create them (every role "
    "creates the topics it names when they are missing). An existing topic is left alone and its partition count "
    "printed; a role refuses a count it cannot serve, naming the topic."
)


def add_topics(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("topics", parents=parents, help=HELP, description=DESCRIPTION)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True, help="create: the only action")
    create = actions.add_parser("create", parents=parents, help="create the named topics (existing ones are left alone)")
    create.add_argument("--bootstrap", required=True, help="Kafka brokers, host:port[,host:port]")
    create.add_argument("names", nargs="+", metavar="TOPIC", help="the topics to create")
    create.add_argument("--partitions", type=positive_int, default=1,
                        help="partitions (default 1: the E-S-A and scale-out topics read as one order)")
    create.add_argument("--compact", action="store_true", help="cleanup.policy=compact (the model topics, a budget topic)")
    create.add_argument("--max-message-bytes", type=positive_int, metavar="BYTES",
                        help="the largest record (a shuffled topic of secure-sum releases: the size the analyzer logs)")
    create.set_defaults(handler=cmd_create)


def cmd_create(args: argparse.Namespace) -> int:
    from panpriv.streamer.kafka import client as kafka_client
    from panpriv.streamer.kafka.topics import TopicSpec, create_topics

    bootstrap = args.bootstrap.split(",")
    specs = [TopicSpec(name, "operator", "panpriv topics create", args.partitions, args.compact, args.max_message_bytes)
             for name in args.names]
    created = set(create_topics(bootstrap, specs))
    probe = kafka_client.consumer(bootstrap, group_id=None, enable_auto_commit=False, client_id="panpriv-topics")
    try:
        for spec in specs:
            count = len(probe.partitions_for_topic(spec.name) or ())
            state = "created" if spec.name in created else "exists"
            print(f"panpriv topics: {spec.name}: {state}, {count or spec.partitions} partition(s)"
                  + (", compacted" if spec.compacted and spec.name in created else ""))
    finally:
        probe.close()
    return EXIT_OK
