"""The one exit-code table of every ``panpriv`` command, and the error → code mapping the CLI applies.

====  ==========================  ===========================================================================
code  meaning                     for example
====  ==========================  ===========================================================================
0     done                        finished; stopped by SIGTERM/SIGINT (a clean stop, final state saved);
                                  stopped by the budget after learning (an outcome: the records it did learn
                                  are accounted); a scale-out model done; ``--help``
1     operational error           a broker or file that cannot be reached, read or written; a Kafka error;
                                  a state directory in use by another process; the budget store failing
2     usage or configuration      a bad flag or config; a key file that holds no key; a learner a role
                                  cannot run; a corrupted or foreign checkpoint or role state, or a refused
                                  resume; a topic whose partition count the role cannot serve; a model a
                                  client must not answer (another key, learner, calibration or record
                                  format); an analyzer state or shuffled topic of the format before onion
                                  sealing (the migration is named); ``predict`` with no record it could
                                  score (the records do not match the model)
3     budget refusal              nothing was learned because the records' budget is spent by other runs
                                  (``--max-epsilon``), or because the model or plan would spend more than
                                  this process may (a worker's ``--max-epsilon``, a client's
                                  ``--max-local-epsilon`` or ``--max-epsilon``, a round beyond the plan)
4     plan cannot complete        a scale-out coordinator that saw no progress toward the next version for
                                  ``--stall-timeout`` seconds: every worker gone, or too few records left for
                                  the open versions (:class:`~panpriv.streamer.errors.PlanStalled`); a
                                  scale-out worker whose coordinator abandoned the model so (it read the end
                                  on the model topic; a model done: 0)
130   interrupted                 Ctrl-C in a command that has no clean stop of its own (``encode``,
                                  ``record``, ``produce``)
====  ==========================  ===========================================================================

Every error is one line on stderr (``panpriv COMMAND: error: …``), never a traceback, except a bug.
"""

from __future__ import annotations

import sqlite3

from panpriv.streamer.errors import (
    CheckpointError,
    ConfigError,
    LearnerInputError,
    LearnerUnavailableError,
    PlanStalled,
    StoppedDuringSetUp,
    StreamerError,
)

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_BUDGET, EXIT_STALLED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130

USAGE_ERRORS: tuple[type[BaseException], ...] = (ConfigError, CheckpointError, LearnerUnavailableError, LearnerInputError)


def exit_code(exc: BaseException) -> int | None:
    """The code for ``exc`` (module docstring), or ``None`` for an unexpected error (a bug)."""
    from kafka.errors import KafkaError

    from panpriv.streamer.budget.store import BudgetExceededError
    from panpriv.streamer.esa.client import PrivacyRefused, RefusedModel
    from panpriv.streamer.esa.keys import KeyFileError
    from panpriv.streamer.esa.model import UnknownModelFormat

    if isinstance(exc, (BudgetExceededError, PrivacyRefused)):
        return EXIT_BUDGET
    if isinstance(exc, (*USAGE_ERRORS, RefusedModel, UnknownModelFormat, KeyFileError)):
        return EXIT_USAGE
    if isinstance(exc, PlanStalled):
        return EXIT_STALLED
    if isinstance(exc, StoppedDuringSetUp):
        return EXIT_OK
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, (StreamerError, sqlite3.Error, OSError, KafkaError)):
        return EXIT_FAILURE
    return None
