"""The budget store on a compacted Kafka topic, for runs on several machines.

Same contents, interface and rules as the SQLite :class:`panpriv.streamer.budget.store.BudgetStore`
(:mod:`panpriv.streamer.budget.rules`: attempts, one live process per run, relabelling only what a
dead process held, reports that never shrink, row checks, a generation that only grows), kept as
keyed messages on one topic of one partition (a total order) with ``cleanup.policy=compact``:

==================================================  ==============================================
key                                                 value (JSON, with its check ``chk``)
==================================================  ==============================================
``m␟schema``                                        schema version (written once, first)
``i␟<instance>``                                    run, report, output directory, start time,
                                                    provisional
``c␟<instance>␟<data key>␟<start>␟<attempt>``      ``stop`` and order of that charged range (an
                                                    extension re-sends the key with a larger stop;
                                                    a moved range is ``{"deleted": true}``)
``r␟<run>``                                         the run's state (:class:`~panpriv.streamer.budget.store.RunState`)
``a␟<attempt>``                                     one process's attempt (:class:`~panpriv.streamer.budget.store.AttemptState`)
==================================================  ==============================================

Compaction keeps the last value of each key, which is the whole state. On open, the store reads
the topic from its first offset to its end; before every budget check and every read it reads what
other processes appended since (about 25 ms on the test broker: two short empty polls at the end).
A charge costs one acknowledged produce (about 2 ms on the test broker) plus that read when
``max_epsilon`` is set. A write is produced with ``acks=all`` and flushed — the broker has it
(on every in-sync replica) before :meth:`KafkaBudgetStore.charge` returns, so a charge is durable
in the cluster before the records it covers are learned.

Identity, integrity and time. The store's id is derived from the cluster identity and the topic
name (two processes creating the topic at once agree on it); every message after the schema
message carries a check keyed by it, verified as it is read (a topic written by an earlier panpriv
is rewritten with checks once, then its old messages are compacted away). The generation is the
offset after the last message read: offsets only grow, compaction keeps them, and a topic deleted
and created again, or restored from a backup, starts lower — caught by
:meth:`KafkaBudgetStore.check_seen`. A topic holding other messages is "not a budget store".

Concurrency limit (stated, not solved). A check against ``max_epsilon`` and the charge it allows
are not atomic across processes: two machines that read the topic, check, and charge within the
same few milliseconds can both pass on the same records and overshoot ``max_epsilon`` together
(each charge is still recorded, so every statement made *after* both charges is correct, and any
later run sees both). The same holds for two processes beginning one run at once: each writes its
attempt, reads the topic again and refuses if it sees another live attempt, so at worst both
refuse. The SQLite store is atomic on one machine. Making this atomic would need a single writer
(e.g. a coordinator keyed by data source) or a conditional append, which Kafka does not offer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from panpriv.accounting.budget import Charge, Excess, compose, exceeds_after, lost_state_report, weakest
from panpriv.accounting.errors import AccountingError
from panpriv.accounting.ledger import PrivacyLedger, PrivacyReport
from panpriv.streamer.budget import rules
from panpriv.streamer.budget.store import (
    AttemptState,
    BudgetError,
    BudgetExceededError,
    InstanceInfo,
    RunState,
    attempt_from,
)
from panpriv.streamer.kafka.topic_reader import TopicReader

SEP = "\x1f"
SCHEMA_VERSION = 2
_PARTITION = 0
_SEEN_EVERY_S = 30.0
_KINDS = {"m": "meta", "i": "instances", "c": "charges", "r": "runs", "a": "attempts"}

T = TypeVar("T")


def _guarded(method: Callable[..., T]) -> Callable[..., T]:
    """Every store failure as one line (:class:`BudgetError`), never a traceback."""

    @functools.wraps(method)
    def wrapper(self: KafkaBudgetStore, *args: Any, **kwargs: Any) -> T:
        from kafka.errors import KafkaError

        try:
            return method(self, *args, **kwargs)
        except (BudgetError, BudgetExceededError):
            raise
        except KafkaError as exc:
            raise BudgetError(f"the budget store {self.path} failed: {exc}; nothing was learned past its last charge") from None
        except (AccountingError, ValueError, KeyError, TypeError) as exc:
            raise BudgetError(f"the budget store {self.path} holds an invalid message ({type(exc).__name__}: {exc}); it "
                              "was written by hand or damaged") from None

    return wrapper


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
        from panpriv.streamer.sources.identity import kafka_cluster_identity

        self.path = f"kafka://{','.join(bootstrap)}/{topic}"
        self.max_records_per_user = max_records_per_user
        self._topic = topic
        self._process = rules.process_identity()
        self._attempts: dict[str, str] = {}  # run -> this process's attempt
        self._seen_at: dict[str, float] = {}
        self._instances: dict[str, dict[str, Any]] = {}
        self._charges: dict[tuple[str, str, int, str], dict[str, Any]] = {}  # (instance, key, start, attempt) -> stop, ord, at
        self._runs: dict[str, dict[str, Any]] = {}
        self._attempt_rows: dict[str, dict[str, Any]] = {}
        self._checked = False  # the schema message was read: every later message must carry its check
        self._position = 0  # the offset after the last message read
        self._written = 0  # the offset after the last message this process wrote
        try:
            _ensure_topic(bootstrap, topic)
            self._producer = kafka_client.producer(bootstrap, acks="all", client_id="panpriv-budget", retries=5)
            consumer = kafka_client.consumer(bootstrap, group_id=None, enable_auto_commit=False, client_id="panpriv-budget")
            consumer.partitions_for_topic(topic)
            cluster = kafka_cluster_identity(consumer, bootstrap)
            self.store_id = hashlib.blake2b(f"{cluster}/{topic}".encode(), digest_size=16).hexdigest()
            self._tp = TopicPartition(topic, _PARTITION)
            self._reader = TopicReader(consumer, [self._tp], self._take)
            self._refresh()
            if not self._checked:
                self._adopt_schema()
        except KafkaError as exc:
            raise BudgetError(f"cannot open the budget store {self.path}: {exc}") from None

    def close(self) -> None:
        """End this process's attempts and close the clients; never raises."""
        try:
            if self._attempts:
                now = time.time()
                self._write([(f"a{SEP}{a}", {**self._attempt_rows[a], "ended": 1, "seen": now})
                             for a in self._attempts.values() if a in self._attempt_rows])
        except Exception:  # noqa: BLE001 - closing on the way out: a broken store stays as it is
            pass
        finally:
            self._attempts.clear()
            for closer in (self._producer.close, self._reader.close):
                try:
                    closer()
                except Exception:  # noqa: BLE001
                    pass

    # -- the log ---------------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Apply every message up to the end of the topic (the caught-up rule of
        :mod:`panpriv.streamer.kafka.topic_reader`: some brokers report an end offset below the last
        record); the generation is then the reader's position (compaction leaves gaps in offsets)."""
        self._reader.catch_up(poll_ms=10)
        self._position = max(self._position, self._reader.consumer.position(self._tp))

    def _take(self, message: Any) -> None:
        self._apply(message.key, message.value, message.offset)
        self._position = message.offset + 1

    def _foreign(self, why: str) -> BudgetError:
        return BudgetError(f"{self.path} is not a budget store ({why}); refusing to use it")

    def _apply(self, raw_key: bytes | None, raw_value: bytes | None, offset: int) -> None:
        try:
            key = (raw_key or b"").decode("utf-8")
            value = None if raw_value is None else json.loads(raw_value)
        except (UnicodeDecodeError, ValueError):
            raise self._foreign(f"an undecodable message at offset {offset:,}") from None
        kind, *parts = key.split(SEP)
        if kind not in _KINDS or (value is not None and not isinstance(value, dict)):
            raise self._foreign(f"a message at offset {offset:,} that panpriv did not write")
        if self._checked:
            if value is None or value.pop("chk", None) != self._check(key, value):
                raise BudgetError(f"the budget store {self.path}: the message at offset {offset:,} fails its integrity "
                                  "check (written by hand or damaged); refusing to use it")
        elif value is not None:
            value.pop("chk", None)
        if kind == "m":
            if parts == ["schema"] and value is not None:
                if int(value.get("version", 0)) != SCHEMA_VERSION:
                    raise BudgetError(f"{self.path}: budget store schema version {value.get('version')}; this panpriv "
                                      f"reads {SCHEMA_VERSION}")
                self._checked = True
            return
        deleted = value is None or bool(value.get("deleted"))
        if kind == "c":
            charge = (parts[0], parts[1], int(parts[2]), parts[3] if len(parts) > 3 else "")
            if deleted:
                self._charges.pop(charge, None)
            else:
                assert value is not None
                self._charges[charge] = {"stop": int(value["stop"]), "ord": str(value.get("ord", "")), "at": offset}
            return
        table = {"i": self._instances, "r": self._runs, "a": self._attempt_rows}[kind]
        if deleted:
            table.pop(parts[0], None)
        else:
            assert value is not None
            table[parts[0]] = value

    def _check(self, key: str, value: Mapping[str, Any]) -> str:
        return rules.row_check(self.store_id, _KINDS[key.split(SEP, 1)[0]], [key, dict(value)])

    def _write(self, messages: list[tuple[str, dict[str, Any]]], read_back: bool = False) -> None:
        """Produce ``messages`` (acks=all, each with its check), wait until the broker has them,
        then apply them (``read_back``: read the topic up to its end instead, with whatever other
        processes wrote meanwhile)."""
        sent = []
        for key, value in messages:
            body = {k: v for k, v in value.items() if k != "chk"}
            body["chk"] = self._check(key, body)
            raw, encoded = json.dumps(body, sort_keys=True).encode("utf-8"), key.encode("utf-8")
            sent.append((encoded, raw, self._producer.send(self._topic, key=encoded, partition=_PARTITION, value=raw)))
        self._producer.flush()
        for encoded, raw, future in sent:
            offset = future.get(timeout=30).offset
            if not read_back:
                self._apply(encoded, raw, offset)
                self._written = max(self._written, offset + 1)
        if read_back:
            self._refresh()

    def _adopt_schema(self) -> None:
        """A new topic gets the schema message; one written by an earlier panpriv (no schema
        message, unchecked) is rewritten after it, with checks and attempts for its runs."""
        state: list[tuple[str, dict[str, Any]]] = []
        for run, data in self._runs.items():
            state.append((f"a{SEP}legacy:{run}", {
                "attempt": f"legacy:{run}", "run": run, "process": "", "started": data.get("started", 0.0),
                "seen": data.get("started", 0.0), "positions": data.get("positions", {}),
                "sequence": int(data.get("sequence", 0)), "clean": int(bool(data.get("clean"))), "ended": 1,
                "settled": int(bool(data.get("clean"))),
                "reports": {n: i["report"] for n, i in self._instances.items() if i.get("run") == run},
            }))
            state.append((f"r{SEP}{run}", dict(data)))
        for name, data in self._instances.items():
            state.append((f"i{SEP}{name}", {"provisional": 0, **data}))
        legacy = {(i, s, a): v for (i, s, a, _), v in self._charges.items()}
        runs_of = {name: data.get("run", "") for name, data in self._instances.items()}
        self._charges.clear()
        for (i, s, a), v in legacy.items():  # the old key (no attempt) is deleted, the charge moves to its run's
            state.append((f"c{SEP}{i}{SEP}{s}{SEP}{a}", {"deleted": True}))
            state.append((f"c{SEP}{i}{SEP}{s}{SEP}{a}{SEP}legacy:{runs_of.get(i, '')}", {"stop": v["stop"], "ord": ""}))
        self._checked = True  # our own messages from here on carry checks
        self._write([(f"m{SEP}schema", {"version": SCHEMA_VERSION}), *state])

    # -- the store's place in time -----------------------------------------------------------------------

    @property
    @_guarded
    def generation(self) -> int:
        """The offset after the last message read or written (it only grows)."""
        self._refresh()
        return max(self._position, self._written)

    def mark(self) -> dict[str, Any]:
        return {"store": self.store_id, "generation": self.generation}

    def check_seen(self, seen: Mapping[str, Any] | None, where: str) -> None:
        why = rules.check_seen(self.store_id, self.generation, seen, where, self.path)
        if why is not None:
            raise BudgetError(why)

    # -- runs and instances ----------------------------------------------------------------------------

    def _live_others(self, run: str, now: float) -> list[AttemptState]:
        return [state for data in self._attempt_rows.values()
                if data.get("run") == run and data["attempt"] not in self._attempts.values()
                and (state := attempt_from(data)).live(now)]

    @_guarded
    def begin_run(self, run: str, out: Path | str, source: str, positions: Mapping[str, int] | None = None
                  ) -> RunState | None:
        """As :meth:`panpriv.streamer.budget.store.BudgetStore.begin_run`; two processes beginning one
        run at once may both be refused (module docstring)."""
        self._refresh()
        now = time.time()
        previous = self.run_state(run)
        others = self._live_others(run, now)
        if others:
            raise self._busy(run, others[0])
        state = dict(self._runs.get(run) or {"out": str(out), "source": source, "started": now,
                                              "sequence": 0, "positions": {}, "losses": 0})
        state.update(out=str(out), clean=0)
        attempt = uuid.uuid4().hex[:16]
        marks = dict(positions) if positions is not None else (previous.positions if previous else {})
        row = {"attempt": attempt, "run": run, "process": self._process, "started": now, "seen": now,
               "positions": marks, "sequence": previous.sequence if previous else 0, "clean": 0, "ended": 0,
               "settled": 0, "reports": {}}
        messages = [(f"r{SEP}{run}", state), (f"a{SEP}{attempt}", row)]
        if run in self._attempts and self._attempts[run] in self._attempt_rows:
            messages.append((f"a{SEP}{self._attempts[run]}", {**self._attempt_rows[self._attempts[run]], "ended": 1}))
        self._write(messages, read_back=True)
        self._attempts[run] = attempt
        self._seen_at[attempt] = now
        others = self._live_others(run, now)
        if others:  # another process began it at the same time
            self._write([(f"a{SEP}{attempt}", {**row, "ended": 1})])
            del self._attempts[run]
            raise self._busy(run, others[0])
        return previous

    @staticmethod
    def _busy(run: str, other: AttemptState) -> BudgetError:
        return BudgetError(f"instance {run} is in use by another live process ({rules.describe_process(other.process)}): "
                           "one process per instance; stop it first, or use another --out")

    def run_state(self, run: str) -> RunState | None:
        data = self._runs.get(run)
        if data is None:
            return None
        return RunState(run, data["out"], data["source"], data["started"], int(data["sequence"]),
                        {str(k): int(v) for k, v in data["positions"].items()}, bool(data.get("clean")),
                        int(data.get("losses", 0)))

    @_guarded
    def attempts(self, run: str | None = None) -> list[AttemptState]:
        self._refresh()
        return sorted((attempt_from(d) for d in self._attempt_rows.values() if run is None or d.get("run") == run),
                      key=lambda a: a.started)

    @_guarded
    def register(self, instance: str, run: str, report: PrivacyReport, out: Path | str, provisional: bool = False) -> None:
        """As :meth:`panpriv.streamer.budget.store.BudgetStore.register`: a stored report never gets stronger."""
        now = time.time()
        stored = self._instances.get(instance)
        if stored is None:
            body = {"run": run, "report": report.to_dict(), "out": str(out), "started": now, "provisional": int(provisional)}
        elif stored.get("provisional"):
            body = {**stored, "report": report.to_dict(), "provisional": int(provisional)}
        elif provisional:
            body = stored
        else:
            body = {**stored, "report": weakest(PrivacyReport.from_dict(stored["report"]), report).to_dict()}
        messages = [] if body is stored else [(f"i{SEP}{instance}", body)]
        attempt = self._attempts.get(run)
        if attempt is not None and not provisional and attempt in self._attempt_rows:
            row = self._attempt_rows[attempt]
            reports = dict(row.get("reports", {}))
            previous = reports.get(instance)
            reports[instance] = (report if previous is None else weakest(PrivacyReport.from_dict(previous), report)).to_dict()
            messages.append((f"a{SEP}{attempt}", {**row, "reports": reports, "seen": now}))
            self._seen_at[attempt] = now
        if messages:
            self._write(messages)

    @_guarded
    def mark_durable(self, run: str, sequence: int, positions: Mapping[str, int], clean: bool = False) -> None:
        messages = []
        if run in self._runs:
            state = dict(self._runs[run])
            state.update(sequence=max(int(state["sequence"]), sequence), clean=int(clean),
                         positions=rules.merged_marks(state["positions"], positions))
            messages.append((f"r{SEP}{run}", state))
        attempt = self._attempts.get(run)
        if attempt is not None and attempt in self._attempt_rows:
            row = dict(self._attempt_rows[attempt])
            row.update(sequence=max(int(row["sequence"]), sequence), clean=int(clean), seen=time.time(),
                       positions=rules.merged_marks(row["positions"], positions))
            messages.append((f"a{SEP}{attempt}", row))
        if messages:
            self._write(messages)


    # -- charges -----------------------------------------------------------------------------------------

    @_guarded
    def charge(self, instance: str, ranges: Mapping[str, tuple[int, int]], limit: float | None = None,
               orders: Mapping[str, str] | None = None) -> Excess | None:
        """As :meth:`panpriv.streamer.budget.store.BudgetStore.charge`, except that check and charge
        are not atomic across processes (module docstring)."""
        ranges = {k: (int(a), int(b)) for k, (a, b) in ranges.items() if b > a}
        if not ranges:
            return None
        orders = dict(orders or {})
        if limit is not None:  # without a limit, only our own charges matter here (to extend a row)
            self._refresh()
            new = [Charge(instance, k, a, b, orders.get(k, "")) for k, (a, b) in ranges.items()]
            excess = self._exceeds(new, limit)
            if excess is not None:
                return excess
        run = self._instances.get(instance, {}).get("run")
        attempt = self._attempts.get(run, "") if run is not None else ""
        messages: list[tuple[str, dict[str, Any]]] = []
        for source, (start, stop) in ranges.items():
            order = orders.get(source, "")
            extended = next((c for c, v in self._charges.items()
                             if c[0] == instance and c[1] == source and c[3] == attempt and v["stop"] == start
                             and v["ord"] == order), None)
            first = extended[2] if extended else start
            messages.append((f"c{SEP}{instance}{SEP}{source}{SEP}{first}{SEP}{attempt}", {"stop": stop, "ord": order}))
        now = time.time()
        if attempt and now - self._seen_at.get(attempt, 0.0) > _SEEN_EVERY_S and attempt in self._attempt_rows:
            messages.append((f"a{SEP}{attempt}", {**self._attempt_rows[attempt], "seen": now}))
            self._seen_at[attempt] = now
        self._write(messages)
        return None

    @_guarded
    def check(self, instance: str, report: PrivacyReport, ranges: Mapping[str, tuple[int, int]], limit: float,
              orders: Mapping[str, str] | None = None) -> Excess | None:
        self._refresh()
        new = [Charge(instance, k, int(a), int(b), (orders or {}).get(k, "")) for k, (a, b) in ranges.items() if b > a]
        return self._exceeds(new, limit, {instance: report})

    def _exceeds(self, new: list[Charge], limit: float, extra: Mapping[str, PrivacyReport] | None = None) -> Excess | None:
        charges = self._charge_list({c.source for c in new})
        names = {c.instance for c in charges} | {c.instance for c in new}
        reports = {name: PrivacyReport.from_dict(self._instances[name]["report"]) for name in names if name in self._instances}
        for name, report in (extra or {}).items():
            reports.setdefault(name, report)
        missing = names - set(reports)
        if missing:
            raise BudgetError(f"{self.path}: charges name instances {sorted(missing)} without a report")
        return exceeds_after(reports, charges, new, limit, self.max_records_per_user)

    def _dead(self, run: str, now: float) -> list[AttemptState]:
        mine = self._attempts.get(run)
        return [state for data in self._attempt_rows.values()
                if data.get("run") == run and data["attempt"] != mine and not data.get("settled")
                and not data.get("clean") and not (state := attempt_from(data)).live(now)]

    @_guarded
    def reclassify_lost(self, instance: str, durable: Mapping[str, int], lost_instance: str, lost_report: PrivacyReport
                        ) -> dict[str, tuple[int, int]]:
        """As :meth:`panpriv.streamer.budget.store.BudgetStore.reclassify_lost`."""
        self._refresh()
        now = time.time()
        info = self._instances.get(instance)
        if info is None:
            return {}
        run = info["run"]
        mine = self._attempts.get(run)
        edges: dict[str, Mapping[str, int]] = {mine or "": dict(durable)}
        report = lost_report
        messages: list[tuple[str, dict[str, Any]]] = []
        for state in self._dead(run, now):
            edges[state.attempt] = rules.merged_marks(state.positions, durable)
            if instance in state.reports:
                report = weakest(report, lost_state_report(state.reports[instance]))
            messages.append((f"a{SEP}{state.attempt}", {**self._attempt_rows[state.attempt], "settled": 1}))
        plan = rules.relabel((rules.Row(key, key[0], key[1], key[2], value["stop"], key[3], value["ord"])
                              for key, value in self._charges.items() if key[0] == instance), edges)
        if plan.moved:
            messages.append(self._lost_message(lost_instance, run, info["out"], report, now))
            for key, stop in plan.shorten.items():
                messages.append((self._charge_key(*key), {"stop": stop, "ord": self._charges[key]["ord"]}))
            for key in plan.delete:
                messages.append((self._charge_key(*key), {"deleted": True}))
            for row, start, stop in plan.moved:
                messages.append((self._charge_key(lost_instance, row.source, start, row.attempt),
                                 {"stop": stop, "ord": row.order}))
            run_row = dict(self._runs[run])
            run_row["losses"] = int(run_row.get("losses", 0)) + 1
            messages.append((f"r{SEP}{run}", run_row))
        if messages:
            self._write(messages)
        return plan.hull()

    @_guarded
    def charge_lost(self, run: str, ranges: Mapping[str, tuple[int, int]], lost_instance: str,
                    lost_report: PrivacyReport, orders: Mapping[str, str] | None = None) -> int:
        """As :meth:`panpriv.streamer.budget.store.BudgetStore.charge_lost`."""
        self._refresh()
        now = time.time()
        dead = self._dead(run, now)
        if not dead:
            return 0
        report = lost_report
        messages: list[tuple[str, dict[str, Any]]] = []
        for state in dead:
            if run in state.reports:
                report = weakest(report, lost_state_report(state.reports[run]))
            messages.append((f"a{SEP}{state.attempt}", {**self._attempt_rows[state.attempt], "settled": 1}))
            messages += [(self._charge_key(lost_instance, source, int(start), state.attempt),
                          {"stop": int(stop), "ord": (orders or {}).get(source, "")})
                         for source, (start, stop) in ranges.items() if stop > start]
        messages.append(self._lost_message(lost_instance, run, self._runs.get(run, {}).get("out", ""), report, now))
        run_row = dict(self._runs[run])
        run_row["losses"] = int(run_row.get("losses", 0)) + 1
        messages.append((f"r{SEP}{run}", run_row))
        self._write(messages)
        return len(dead)

    @_guarded
    def attempts_charging(self, instance: str, ranges: Mapping[str, tuple[int, int]]) -> set[str]:
        """As :meth:`panpriv.streamer.budget.store.BudgetStore.attempts_charging`."""
        self._refresh()
        return {attempt for (name, source, start, attempt), value in self._charges.items()
                if name == instance and source in ranges and start < ranges[source][1] and ranges[source][0] < value["stop"]}

    @_guarded
    def uncharge(self, instance: str, positions: Mapping[str, int]) -> None:
        """As :meth:`panpriv.streamer.budget.store.BudgetStore.uncharge`."""
        run = self._instances.get(instance, {}).get("run")
        attempt = self._attempts.get(run) if run is not None else None
        if attempt is None:
            return
        messages: list[tuple[str, dict[str, Any]]] = []
        for key, value in self._charges.items():
            position = positions.get(key[1])
            if key[0] == instance and key[3] == attempt and position is not None and value["stop"] > position:
                body: dict[str, Any] = ({"stop": int(position), "ord": value["ord"]} if key[2] < position
                                        else {"deleted": True})
                messages.append((self._charge_key(*key), body))
        if messages:
            self._write(messages)

    def _lost_message(self, lost_instance: str, run: str, out: str, report: PrivacyReport, now: float
                      ) -> tuple[str, dict[str, Any]]:
        stored = self._instances.get(lost_instance)
        if stored is not None:
            report = weakest(PrivacyReport.from_dict(stored["report"]), report)
        return (f"i{SEP}{lost_instance}", {"run": run, "report": report.to_dict(), "out": out,
                                            "started": stored["started"] if stored else now, "provisional": 0})

    @staticmethod
    def _charge_key(instance: str, source: str, start: int, attempt: str) -> str:
        return f"c{SEP}{instance}{SEP}{source}{SEP}{start}{SEP}{attempt}"

    @_guarded
    def holds(self, prefix: str) -> bool:
        self._refresh()
        return any(key[1].startswith(prefix) for key in self._charges)

    @_guarded
    def adopt(self, old_key: str, new_key: str, order: str) -> int:
        self._refresh()
        moved = [(key, value) for key, value in self._charges.items() if key[1] == old_key]
        messages: list[tuple[str, dict[str, Any]]] = []
        for (instance, _, start, attempt), value in moved:
            messages.append((self._charge_key(instance, old_key, start, attempt), {"deleted": True}))
            messages.append((self._charge_key(instance, new_key, start, attempt), {"stop": value["stop"], "ord": order}))
        if messages:
            self._write(messages)
        return len(moved)

    # -- reading -----------------------------------------------------------------------------------------

    def _charge_list(self, sources: Iterable[str] | None) -> list[Charge]:
        wanted = None if sources is None else set(sources)
        items = sorted(((v["at"], key, v) for key, v in self._charges.items() if wanted is None or key[1] in wanted),
                       key=lambda item: item[0])
        return [Charge(key[0], key[1], key[2], v["stop"], v["ord"]) for _, key, v in items]

    @_guarded
    def ledger(self, sources: Iterable[str] | None = None) -> PrivacyLedger:
        self._refresh()
        charges = self._charge_list(sources)
        names = {c.instance for c in charges}
        missing = names - set(self._instances)
        if missing:
            raise BudgetError(f"{self.path}: charges name instances {sorted(missing)} without a report")
        reports = {name: PrivacyReport.from_dict(self._instances[name]["report"]) for name in names}
        return compose(reports, charges, self.max_records_per_user)

    @_guarded
    def instances(self) -> dict[str, InstanceInfo]:
        self._refresh()
        return {
            name: InstanceInfo(name, data["run"], PrivacyReport.from_dict(data["report"]), data["out"], data["started"])
            for name, data in self._instances.items()
        }

    @_guarded
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
