"""The budget store on a compacted Kafka topic, for runs on several machines.

Same contents and interface as the SQLite :class:`panpriv.streamer.budget.store.BudgetStore` (instances with
their reports, charged ranges, runs' durable positions), kept as keyed messages on one topic of
one partition (a total order) with ``cleanup.policy=compact``:

=======================================  ==============================================
key                                      value (JSON; a null value deletes the key)
=======================================  ==============================================
``i␟<instance>``                         run, report, output directory, start time
``c␟<instance>␟<data key>␟<start>``      ``stop`` of that charged range (an extension
                                         re-sends the key with a larger stop)
``r␟<run>``                              the run's state (:class:`~panpriv.streamer.budget.store.RunState`)
=======================================  ==============================================

Compaction keeps the last value of each key, which is the whole state. On open, the store reads
the topic from its first offset to its end; before every budget check and every read it reads what
other processes appended since (about 25 ms on the test broker: two short empty polls at the end).
A charge costs one acknowledged produce (about 2 ms on the test broker) plus that read when
``max_epsilon`` is set. A write is produced with ``acks=all`` and flushed — the broker has it
(on every in-sync replica) before :meth:`KafkaBudgetStore.charge` returns, so a charge is durable
in the cluster before the records it covers are learned.

Concurrency limit (stated, not solved). A check against ``max_epsilon`` and the charge it allows
are not atomic across processes: two machines that read the topic, check, and charge within the
same few milliseconds can both pass on the same records and overshoot ``max_epsilon`` together
(each charge is still recorded, so every statement made *after* both charges is correct, and any
later run sees both). The SQLite store is atomic on one machine. Making this atomic would need a
single writer (e.g. a coordinator keyed by data source) or a conditional append, which Kafka does
not offer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from panpriv.accounting.budget import Charge, Excess, compose, exceeds
from panpriv.accounting.ledger import PrivacyLedger, PrivacyReport
from panpriv.streamer.budget.store import BudgetError, InstanceInfo, RunState
from panpriv.streamer.kafka.topic_reader import TopicReader

SEP = "\x1f"
_PARTITION = 0


class KafkaBudgetStore:
    """The budget store on ``topic`` of the cluster at ``bootstrap`` (created, compacted, if missing).

    Parameters
    ----------
    bootstrap
        Broker addresses, ``["host:port", …]``.
    topic
        The store's topic (``[budget] kafka_topic``); one partition.
    max_records_per_user
        As for :class:`panpriv.streamer.budget.store.BudgetStore`.
    """

    def __init__(self, bootstrap: list[str], topic: str, max_records_per_user: int | None = None) -> None:
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        from panpriv.streamer.kafka import client as kafka_client

        self.path = f"kafka://{','.join(bootstrap)}/{topic}"
        self.max_records_per_user = max_records_per_user
        self._topic = topic
        self._instances: dict[str, dict[str, Any]] = {}
        self._charges: dict[tuple[str, str, int], int] = {}
        self._runs: dict[str, dict[str, Any]] = {}
        try:
            _ensure_topic(bootstrap, topic)
            self._producer = kafka_client.producer(bootstrap, acks="all", client_id="panpriv-budget", retries=5)
            # fetch_max_wait_ms: an empty fetch at the end of the topic returns at once instead of after
            # the default 500 ms (a refresh before every charge ends with two empty polls).
            consumer = kafka_client.consumer(bootstrap, group_id=None, enable_auto_commit=False,
                                             client_id="panpriv-budget", fetch_max_wait_ms=5)
            self._reader = TopicReader(consumer, [TopicPartition(topic, _PARTITION)], self._take)
            self._refresh()
        except KafkaError as exc:
            raise BudgetError(f"cannot open the budget store {self.path}: {exc}") from None

    def close(self) -> None:
        self._producer.close()
        self._reader.close()

    # -- the log ---------------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Apply every message up to the end of the topic (the caught-up rule of
        :mod:`panpriv.streamer.kafka.topic_reader`: some brokers report an end offset below the last record)."""
        self._reader.catch_up(poll_ms=10)

    def _take(self, message: Any) -> None:
        self._apply(message.key.decode("utf-8"), message.value)

    def _apply(self, key: str, value: bytes | None) -> None:
        kind, *parts = key.split(SEP)
        data = None if value is None else json.loads(value)
        if kind == "i":
            table, name = self._instances, parts[0]
        elif kind == "r":
            table, name = self._runs, parts[0]
        elif kind == "c":
            charge = (parts[0], parts[1], int(parts[2]))
            if data is None:
                self._charges.pop(charge, None)
            else:
                self._charges[charge] = int(data["stop"])
            return
        else:
            return
        if data is None:
            table.pop(name, None)
        else:
            table[name] = data

    def _write(self, messages: list[tuple[str, dict[str, Any] | None]]) -> None:
        """Produce ``messages`` (acks=all), wait until the broker has them, then apply them."""
        futures = [
            self._producer.send(
                self._topic, key=key.encode("utf-8"), partition=_PARTITION,
                value=None if value is None else json.dumps(value, sort_keys=True).encode("utf-8"),
            )
            for key, value in messages
        ]
        self._producer.flush()
        for future in futures:
            future.get(timeout=30)
        for key, value in messages:
            self._apply(key, None if value is None else json.dumps(value).encode("utf-8"))

    # -- runs and instances ----------------------------------------------------------------------------

    def begin_run(self, run: str, out: Path | str, source: str) -> RunState | None:
        self._refresh()
        previous = self.run_state(run)
        state = dict(self._runs.get(run) or {"out": str(out), "source": source, "started": time.time(),
                                                "sequence": 0, "positions": {}, "losses": 0})
        state.update(out=str(out), clean=False)
        self._write([(f"r{SEP}{run}", state)])
        return previous

    def run_state(self, run: str) -> RunState | None:
        data = self._runs.get(run)
        if data is None:
            return None
        return RunState(run, data["out"], data["source"], data["started"], int(data["sequence"]),
                        {str(k): int(v) for k, v in data["positions"].items()}, bool(data.get("clean")),
                        int(data.get("losses", 0)))

    def register(self, instance: str, run: str, report: PrivacyReport, out: Path | str) -> None:
        now = time.time()
        started = self._instances.get(instance, {}).get("started", now)
        self._write([(f"i{SEP}{instance}", {"run": run, "report": report.to_dict(), "out": str(out), "started": started})])

    def mark_durable(self, run: str, sequence: int, positions: Mapping[str, int], clean: bool = False) -> None:
        state = dict(self._runs[run])
        state.update(sequence=max(int(state["sequence"]), sequence), positions=dict(positions), clean=clean)
        self._write([(f"r{SEP}{run}", state)])

    def note_loss(self, run: str) -> None:
        state = dict(self._runs[run])
        state["losses"] = int(state.get("losses", 0)) + 1
        self._write([(f"r{SEP}{run}", state)])

    # -- charges -----------------------------------------------------------------------------------------

    def charge(self, instance: str, ranges: Mapping[str, tuple[int, int]], limit: float | None = None) -> Excess | None:
        """As :meth:`panpriv.streamer.budget.store.BudgetStore.charge`, except that check and charge are not
        atomic across processes (module docstring)."""
        ranges = {k: (int(a), int(b)) for k, (a, b) in ranges.items() if b > a}
        if not ranges:
            return None
        if limit is not None:  # without a limit, only our own charges matter here (to extend a row)
            self._refresh()
            excess = exceeds(self._ledger(ranges, also=(instance,)), instance, ranges, limit)
            if excess is not None:
                return excess
        messages: list[tuple[str, dict[str, Any] | None]] = []
        for source, (start, stop) in ranges.items():
            extended = next(
                (c for c, end in self._charges.items() if c[0] == instance and c[1] == source and end == start), None
            )
            first = extended[2] if extended else start
            messages.append((f"c{SEP}{instance}{SEP}{source}{SEP}{first}", {"stop": stop}))
        self._write(messages)
        return None

    def reclassify_lost(
        self, instance: str, durable: Mapping[str, int], lost_instance: str, lost_report: PrivacyReport
    ) -> dict[str, tuple[int, int]]:
        self._refresh()
        lost: dict[str, tuple[int, int]] = {}
        messages: list[tuple[str, dict[str, Any] | None]] = []
        for (owner, source, start), stop in list(self._charges.items()):
            edge = int(durable.get(source, 0))
            if owner != instance or stop <= edge:
                continue
            key = f"c{SEP}{instance}{SEP}{source}{SEP}{start}"
            messages.append((key, {"stop": edge} if start < edge else None))
            begin = max(start, edge)
            messages.append((f"c{SEP}{lost_instance}{SEP}{source}{SEP}{begin}", {"stop": stop}))
            a, b = lost.get(source, (begin, stop))
            lost[source] = (min(a, begin), max(b, stop))
        if messages:
            info = self._instances[instance]
            self._write([(f"i{SEP}{lost_instance}", {"run": info["run"], "report": lost_report.to_dict(),
                                                        "out": info["out"], "started": time.time()}), *messages])
            self.note_loss(info["run"])
        return lost

    # -- reading -----------------------------------------------------------------------------------------

    def _ledger(self, sources: Iterable[str] | None, also: Iterable[str] = ()) -> PrivacyLedger:
        wanted = None if sources is None else set(sources)
        charges = sorted(
            (Charge(owner, source, start, stop) for (owner, source, start), stop in self._charges.items()
             if wanted is None or source in wanted),
            key=lambda c: (c.source, c.start, c.instance),
        )
        names = {c.instance for c in charges} | set(also)
        missing = names - set(self._instances)
        if missing:
            raise BudgetError(f"{self.path}: charges name instances {sorted(missing)} without a report")
        reports = {name: PrivacyReport.from_dict(self._instances[name]["report"]) for name in names}
        return compose(reports, charges, self.max_records_per_user)

    def ledger(self, sources: Iterable[str] | None = None) -> PrivacyLedger:
        self._refresh()
        return self._ledger(sources)

    def instances(self) -> dict[str, InstanceInfo]:
        self._refresh()
        return {
            name: InstanceInfo(name, data["run"], PrivacyReport.from_dict(data["report"]), data["out"], data["started"])
            for name, data in self._instances.items()
        }

    def runs(self) -> list[RunState]:
        self._refresh()
        states = [state for run in self._runs if (state := self.run_state(run)) is not None]
        return sorted(states, key=lambda s: s.started)


def _ensure_topic(bootstrap: list[str], topic: str) -> None:
    """Create ``topic`` (one partition, compacted, replicated on up to 3 brokers) unless it exists;
    an existing topic with another partition count is refused (:mod:`panpriv.streamer.kafka.topics`).
    An operator may create it beforehand with other settings, but with one partition."""
    from panpriv.streamer.kafka.topics import TopicSpec, ensure_topics

    ensure_topics(bootstrap, [TopicSpec(topic, "budget store", "its charges are one total order", compacted=True)])
