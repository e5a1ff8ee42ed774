"""What a read of the service's memory or disk finds besides the learner's state: the sentence every
statement of a run carries (docs/privacy.md, "Process memory", "Checkpoints on disk", "The input
path"; tested by tests/streamer/test_service_intruder.py and tests/streamer/test_persisted_states.py).

The learner's own report says what one intrusion into its state reveals. A real intruder reads
the whole process, and a reader of the disk reads every checkpoint ever written: this module says,
for the run at hand, what else they find — which depends on the learner (whether it saves only
batch boundaries), on the source (what its client keeps of the raw messages) and on whether the
process runs with the allocator that erases what it frees (:mod:`panpriv.streamer.runtime.allocator`).
"""

from __future__ import annotations

from panpriv.protocols.base import Learner
from panpriv.streamer.io.indexed import IndexedFile
from panpriv.streamer.kafka import client as kafka_client
from panpriv.streamer.sources.base import Source
from panpriv.streamer.sources.kafka import KafkaConsumerSource

MICRO_BATCHES = 2
"""K: a dump of a run with the wiping allocator holds raw records of at most the last K
micro-batches (the one being learned and the one before) besides the source's read-ahead."""


def read_ahead(source: Source | IndexedFile) -> str:
    """What the source's client keeps of the raw messages around the position read."""
    if isinstance(source, KafkaConsumerSource):
        if kafka_client.settings().client == "confluent":
            return ("librdkafka's queue of fetched messages (fetch.max.bytes and queued.max.messages.kbytes bound it; "
                    "its buffers are the client's, not erased)")
        return ("the Kafka fetch response being consumed and the one fetched ahead, which kafka-python keeps whole "
                "(fetch_max_bytes, max_partition_fetch_bytes bound them)")
    return "the 64 KiB read buffer of the file"


def sentences(learner: Learner, source: Source | IndexedFile, wiping: bool) -> tuple[str, ...]:
    """The statement's sentence on memory, disk and input for this run."""
    if learner.records_to_boundary() is not None:
        disk = ("checkpoints on disk hold the learner state at its last batch boundary, before the next batch's first "
                "draw: post-processing of the noisy batch means every release comes from, so reading every checkpoint "
                "ever written adds nothing to the outputs; the open batch's records are read again after a resume")
    else:
        disk = ("checkpoints on disk hold the learner state (noisy iterates or messages), each record protected by its "
                "own noise: reading every checkpoint ever written is covered by the intrusion guarantee")
    if wiping:
        memory = (f"a read of the process's memory finds the learner's state and no other copy of it, no noise draw, "
                  f"and raw records of at most the last {MICRO_BATCHES} micro-batches plus {read_ahead(source)}; freed "
                  f"memory is overwritten (wiping allocator), and a replaced checkpoint file too")
    else:
        memory = ("a read of the process's memory finds the learner's state and no other copy of it and no noise draw; "
                  "raw records read earlier may remain in freed memory (the wiping allocator is off: "
                  "PANPRIV_ALLOCATOR=default, or not Linux with glibc), and those get no intrusion guarantee")
    return (f"memory and disk: {memory}; {disk}",)
