"""Exceptions raised by the streamer package.

Every error a user can cause (a bad flag, a bad config file, a checkpoint written under a different
privacy configuration, an unreachable broker) is a :class:`StreamerError` with a message that says
what is wrong and what to do; the CLI prints it and exits non-zero without a traceback.
"""

from __future__ import annotations


class StreamerError(Exception):
    """Base class for every error raised by :mod:`streamer`."""


class ConfigError(StreamerError, ValueError):
    """The configuration (file or flags) is invalid; the message names the setting."""


class CheckpointError(StreamerError):
    """A checkpoint cannot be read, or cannot be resumed under the current configuration."""


class SourceError(StreamerError):
    """A source URL is malformed, or the source cannot be opened or read."""


class LearnerUnavailableError(StreamerError):
    """A learner name is known to panpriv but its implementation is not in this build."""


class LearnerInputError(StreamerError):
    """The learner refused records that passed validation: ``[records]`` does not describe what
    the learner accepts. The learner's own message is withheld (it may quote record values)."""


class OutputError(StreamerError):
    """The output directory (``--out``) cannot be used: not a directory, not writable, full, or in
    use by another process. The message names the path, the operating system's reason and the fix."""


class OutputBusyError(OutputError):
    """Another process holds the output directory's lock (:mod:`panpriv.streamer.state.lock`)."""


class PlanStalled(StreamerError):
    """A scale-out plan that cannot complete: nothing moved toward the next model version for the
    coordinator's ``--stall-timeout`` (all workers gone, or too few records left for the open
    versions). The message names the version, the means in and the workers heard from."""


class StoppedDuringSetUp(BaseException):
    """SIGTERM/SIGINT arrived before the run's first record (a tight calibration can take seconds):
    the run stops at once, with nothing learned, snapshotted or checkpointed. A clean stop (exit 0),
    like a stop requested while learning; a :class:`BaseException` so that no ``except Exception``
    in the set-up swallows it."""
