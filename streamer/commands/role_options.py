"""The flags every role that charges the budget store shares (``analyze``, ``worker``), in one place.

Where the store is (``--state-dir``, or ``--budget-kafka URL``: the one name of the Kafka store in
every command; ``--budget-topic T`` on the role's brokers is its deprecated alias), what the process may spend (``--max-epsilon``) and the declared records-per-user bound
(``--max-records-per-user``: the store's user-level figures, as ``learner.max_records_per_user``
gives them for ``panpriv run``) → one :class:`panpriv.streamer.budget.open.BudgetSettings`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from panpriv.streamer.arg_types import positive_float, positive_int
from panpriv.streamer.commands.help_text import DeprecatedFlag

BUDGET_KAFKA_HELP = (
    "keep the budget store on this compacted Kafka topic instead (several machines): kafka://host:port[,host:port]/topic"
)

STATE_DIR_HELP = (
    "directory of the budget store shared by every run (default $PANPRIV_STATE_DIR, else $XDG_STATE_HOME/panpriv, "
    "else ~/.local/state/panpriv)"
)


def budget_flags(parser: argparse.ArgumentParser, max_epsilon_help: str) -> None:
    """Add the budget flags to a role's parser."""
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--state-dir", type=Path, help=STATE_DIR_HELP)
    store.add_argument("--budget-kafka", metavar="URL", help=BUDGET_KAFKA_HELP)
    store.add_argument("--budget-topic", action=DeprecatedFlag, use="--budget-kafka kafka://HOST:PORT/TOPIC")
    parser.add_argument("--max-epsilon", type=positive_float, help=max_epsilon_help)
    parser.add_argument("--max-records-per-user", type=positive_int, metavar="K",
                        help="declare that a user contributes at most K records: the budget store's statements add "
                        "the user-level guarantee (as learner.max_records_per_user for panpriv run)")


def budget_settings(args: argparse.Namespace) -> Any:
    """The :class:`~panpriv.streamer.budget.open.BudgetSettings` of :func:`budget_flags`' flags."""
    from panpriv.streamer.budget.open import BudgetSettings

    if args.budget_topic:
        return BudgetSettings(None, tuple(args.bootstrap.split(",")), args.budget_topic, args.max_epsilon,
                              args.max_records_per_user)
    return BudgetSettings.from_url(args.state_dir, args.budget_kafka, args.max_epsilon, args.max_records_per_user)
