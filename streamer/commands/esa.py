"""The command-line roles of Encode–Shuffle–Analyze: ``panpriv keygen``, ``encode``, ``shuffle``,
``analyze`` (:mod:`panpriv.streamer.esa`; Bittau et al. 2017 §3). Wired into :mod:`panpriv.streamer.commands.cli`."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import panpriv
from panpriv.streamer.arg_types import json_object, positive_float, positive_int
from panpriv.streamer.commands.exit_codes import EXIT_OK, EXIT_USAGE, exit_code
from panpriv.streamer.commands.help_text import DeprecatedFlag
from panpriv.streamer.commands.role_options import budget_flags, budget_settings
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.metrics.roles import metrics_flags, serve_metrics

log = logging.getLogger("panpriv.esa")


def _kafka(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="Kafka brokers, host:port[,host:port]")


def _deployment(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--deployment NAME``, as the scale-out roles name it (``--name``: its deprecated alias)."""
    parser.add_argument("--deployment", default="default",
                        help="the deployment's name: the key of its model on the model topic (default 'default')")
    parser.add_argument("--name", dest="deployment", action=DeprecatedFlag, use="--deployment NAME")


# -- keygen -------------------------------------------------------------------------------------


def add_keygen(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("keygen", parents=parents, help="ESA: create an analyzer or shuffler key pair (private file 0600)",
                                 description="Write <role>-<id>.key (0600) and <role>-<id>.pub into DIR; for the shuffler "
                                 "also shuffler-<id>.verify (its batch-signing key's verify key, for the analyzer).")
    parser.add_argument("dir", type=Path, help="directory for the key files (created 0700)")
    parser.add_argument("--if-missing", action="store_true",
                        help="do nothing if DIR already holds a private key of the role (a one-shot init container); "
                        "shuffler: write a missing shuffler-<id>.verify beside an existing key")
    parser.add_argument("--public-dir", type=Path, metavar="DIR",
                        help="also copy the public files (.pub, .verify) into DIR, for the roles that must not see the "
                        "private directory (the deploy/ stack's public volume)")
    parser.add_argument("--role", choices=("analyzer", "shuffler"), default="analyzer",
                        help="shuffler: the shuffler's pair (shuffler-<id>.key opens the outer layer of messages and signs "
                        "batches; clients get .pub, the analyzer .verify)")
    parser.set_defaults(handler=cmd_keygen)


def cmd_keygen(args: argparse.Namespace) -> int:
    from panpriv.streamer.esa.keys import generate, private_files, publish, verify_path, write_verify_key

    if args.if_missing and args.dir.is_dir() and (existing := private_files(args.dir, args.role)):
        print(f"panpriv keygen: {len(existing)} key(s) already in {args.dir}; newest {existing[0].name}")
        for path in existing:
            if args.role == "shuffler" and not verify_path(path).exists():
                print(f"  wrote {write_verify_key(path)} (the verify key of {path.name}: give it to the analyzer)")
            if args.public_dir is not None:
                publish(path, args.public_dir)
        return EXIT_OK
    files = generate(args.dir, args.role)
    print(f"panpriv keygen: key id {files.key_id}\n  private {files.private} (0600: the {args.role} only)\n"
          f"  public  {files.public} (give it to clients)"
          + (f"\n  verify  {files.verify} (give it to the analyzer: --shuffler-verify-key)" if files.verify else ""))
    if args.public_dir is not None:
        print(f"  copied to {args.public_dir}: {', '.join(p.name for p in publish(files.private, args.public_dir))}")
    return EXIT_OK


# -- encode -------------------------------------------------------------------------------------


def add_encode(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "encode", parents=parents, help="ESA client: encode records as sealed messages for the current round",
        description="Simulate users: for each round, read the public model, encode the next --per-round records "
        "(one message per record, sealed to the analyzer's public key, then to the shuffler's) and send them to the "
        "messages topic; then "
        "wait for the next round's model. One user, one record: each record is encoded once.")
    _kafka(parser)
    parser.add_argument("--model-topic", required=True, help="where the analyzer publishes each round's public model (read)")
    parser.add_argument("--messages-topic", required=True, help="where the sealed messages go (the shuffler reads it)")
    parser.add_argument("--analyzer-key", type=Path, required=True, help="the analyzer's public key file (.pub)")
    parser.add_argument("--shuffler-key", type=Path, required=True,
                        help="the shuffler's public key file (shuffler-<id>.pub): every message is sealed to the analyzer, "
                        "then to the shuffler")
    parser.add_argument("--source", type=Path, required=True, help="JSONL records {\"x\": [...], \"y\": ±1}")
    parser.add_argument("--per-round", type=positive_int, help="records per round (default: the model's batch size)")
    _deployment(parser)
    parser.add_argument("--max-local-epsilon", type=positive_float, help="refuse a model with weaker local privacy")
    parser.add_argument("--timeout", type=positive_float, default=120.0, help="seconds to wait for a round's model")
    parser.add_argument("--state", type=Path,
                        help="shuffle-gd: the file of the rounds these users answered and the plan they accepted (they "
                        "answer each round once, at most T rounds; default SOURCE.gd-rounds.json)")
    parser.add_argument("--max-epsilon", type=positive_float,
                        help="shuffle-gd: refuse a plan whose T rounds compose to a larger epsilon")
    parser.set_defaults(handler=cmd_encode)


def _jsonl(path: Path) -> Iterator[tuple[list[float], float]]:
    with path.open() as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                yield record["x"], float(record["y"])


def _chunks(path: Path, first: int, size: int | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    rows: list[list[float]] = []
    labels: list[float] = []
    want = first
    for x, y in _jsonl(path):
        rows.append(x)
        labels.append(y)
        if len(rows) == want:
            yield np.asarray(rows, dtype=np.float64), np.asarray(labels)
            rows, labels = [], []
            want = size or first
    if rows:
        yield np.asarray(rows, dtype=np.float64), np.asarray(labels)


def _encoder(args: argparse.Namespace, public: Any, shuffler: Any, model: Any) -> Any:
    """The client encoder of the model's learner (:mod:`panpriv.streamer.esa.families`): every one
    seals to the analyzer's key, then to the shuffler's."""
    return _family_of(model).encoder_class()(public, shuffler, model, args.max_local_epsilon)


def _family_of(model: Any) -> Any:
    from panpriv.streamer.esa.client import RefusedModel
    from panpriv.streamer.esa.families import UnknownFamilyError, family

    try:
        return family(model.learner)
    except UnknownFamilyError as exc:
        raise RefusedModel(str(exc)) from None


def cmd_encode(args: argparse.Namespace) -> int:
    from panpriv.streamer.esa.client import MessageSender, RefusedModel
    from panpriv.streamer.esa.keys import load_public
    from panpriv.streamer.esa.model import ModelWatcher, UnknownModelFormat
    from panpriv.streamer.esa.shuffler import deployment_topics
    from panpriv.streamer.kafka.client import security_options
    from panpriv.streamer.kafka.topics import ensure_topics

    public, shuffler = load_public(args.analyzer_key), load_public(args.shuffler_key)
    bootstrap = args.bootstrap.split(",")
    security = security_options()  # the [kafka] section of --config (TLS, SASL)
    ensure_topics(bootstrap, deployment_topics(args.messages_topic, model=args.model_topic))  # before a producer could auto-create them
    watcher = ModelWatcher(bootstrap, args.model_topic, args.deployment, **security)
    sender = MessageSender(bootstrap, args.messages_topic, **security)
    sent = rounds = 0
    try:
        model = watcher.current()
        if model is None:
            model = watcher.wait_for(0, args.timeout)
        if _family_of(model).client == "every-round":  # every user answers each of T rounds
            return _encode_gd(args, public, shuffler, model, watcher, sender)
        per_round = args.per_round or int(model.calibration["batch_size"])
        for X, y in _chunks(args.source, per_round, per_round):
            encoder = _encoder(args, public, shuffler, model)
            sender.send(encoder.encode(X, y))
            sent += len(y)
            rounds += 1
            log.info("sent %d messages for round %d", len(y), model.round)
            if len(y) == per_round:
                model = watcher.wait_for(model.round + 1, args.timeout)
    except (RefusedModel, UnknownModelFormat) as exc:  # not to be answered: key, calibration, format (2); privacy (3)
        print(f"panpriv encode: refused the model: {exc} (sent {sent:,} messages over {rounds} rounds)")
        return exit_code(exc) or EXIT_USAGE
    finally:
        sender.close()
        watcher.close()
    print(f"panpriv encode: sent {sent:,} messages over {rounds} rounds")
    return EXIT_OK


def _encode_gd(args: argparse.Namespace, public: Any, shuffler: Any, model: Any, watcher: Any, sender: Any) -> int:
    """shuffle-gd: every record of --source is a user who answers every round once (panpriv.streamer.esa.gd_client)."""
    from panpriv.streamer.esa.client import RefusedModel
    from panpriv.streamer.esa.gd_client import AnsweredRounds, GDClients, serve

    rows = list(_jsonl(args.source))
    X = np.asarray([x for x, _ in rows], dtype=np.float64)
    y = np.asarray([label for _, label in rows])
    state = AnsweredRounds(args.state or args.source.with_name(args.source.name + ".gd-rounds.json"))
    clients = GDClients(public, shuffler, X, y, state, args.max_local_epsilon, args.max_epsilon)
    try:
        answered = serve(clients, lambda: model, lambda r: watcher.wait_for(r, args.timeout), sender.send, log.info)
    except RefusedModel as exc:  # the refusal rule: a plan other than the accepted one, or a round beyond it
        print(f"panpriv encode: refused: {exc} (rounds answered: {state.rounds})")
        return exit_code(exc) or EXIT_USAGE
    finally:
        state.close()
    per_user = 1000 * sum(clients.encode_seconds) / max(1, answered * len(y))
    print(f"panpriv encode: {len(y):,} shuffle-gd users answered {answered} rounds here (rounds answered in all: "
          f"{state.rounds}); encode {per_user:.3f} ms per user and round")
    return EXIT_OK


# -- shuffle ------------------------------------------------------------------------------------


def add_shuffle(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "shuffle", parents=parents,
        help="ESA shuffler: remove its layer, strip metadata, threshold at b, permute, sign (opens no unit)",
        description="Consume the messages topic (one partition), keep values only, remove the shuffler's layer of each "
        "message, release each round at exactly --batch-size messages as one permuted batch (OS entropy) signed with "
        "the shuffler's key on the shuffled topic; exactly once w.r.t. its input.")
    _kafka(parser)
    parser.add_argument("--messages-topic", required=True, help="the clients' sealed messages (read; one partition)")
    parser.add_argument("--shuffled-topic", required=True, help="where the signed, permuted batches go (the analyzer reads it)")
    parser.add_argument("--shuffler-key", type=Path, required=True,
                        help="the shuffler's private key file (panpriv keygen DIR --role shuffler), or DIR (its newest "
                        "shuffler-*.key): opens the outer layer of messages and signs batches")
    parser.add_argument("--batch-size", type=positive_int, required=True, help="b: messages per released round")
    parser.add_argument("--params", type=positive_int, required=True,
                        help="coordinates per message (dim + 1 with an intercept): fixes the message size")
    parser.add_argument("--group", default="panpriv-shuffler", help="consumer group for the input offsets")
    parser.add_argument("--drop-short-after", type=positive_float, metavar="SECONDS",
                        help="drop a round still short of b this long after its first message (default: wait)")
    parser.add_argument("--max-rounds", type=positive_int, help="exit after releasing this many rounds")
    parser.add_argument("--max-ahead", type=positive_int, default=1,
                        help="drop messages for rounds more than this past the last released (default 1)")
    parser.add_argument("--shares", type=positive_int, metavar="M",
                        help="shuffle-acsa, shuffle-sgd, shuffle-gd: each message is one user's M sealed shares; release "
                        "their units (M as 'panpriv analyze --learner shuffle-acsa|shuffle-sgd|shuffle-gd' logs it)")
    checkin = parser.add_argument_group("checkin (random check-ins: per-slot releases; --batch-size is slot_length)")
    checkin.add_argument("--checkin", action="store_true",
                         help="each message is a check-in; release per slot (rules and each slot's analyzer key from the model)")
    checkin.add_argument("--analyzer-key", type=Path, action="append",
                         help="the analyzer's public key (.pub), or a directory of them (repeatable): seals the dummy of an "
                         "empty slot to the key the slot's model names")
    checkin.add_argument("--model-topic", help="where the analyzer publishes the deployment's public configuration")
    _deployment(checkin)
    checkin.add_argument("--close-after", type=positive_float, metavar="SECONDS",
                         help="close a wake slot still incomplete this long after the previous release (default: wait)")
    metrics_flags(parser)
    parser.set_defaults(handler=cmd_shuffle)


def cmd_shuffle(args: argparse.Namespace) -> int:
    from panpriv.streamer.esa import shuffler, slot_shuffler
    from panpriv.streamer.esa.metrics import ShufflerMetrics

    if args.checkin and not (args.analyzer_key and args.model_topic):
        raise ConfigError("--checkin needs --analyzer-key and --model-topic")
    metrics = ShufflerMetrics(slot_shuffler.DROP_REASONS if args.checkin else shuffler.DROP_REASONS)
    metrics.set_info("shuffler", args.messages_topic, panpriv.__version__)
    stop_server = serve_metrics(metrics, args)
    options = shuffler.ShuffleOptions(
        args.bootstrap.split(","), args.messages_topic, args.shuffled_topic, args.batch_size, args.params,
        args.group, args.shuffler_key, args.drop_short_after, args.max_rounds, max_ahead=args.max_ahead,
        metrics=metrics, shares=args.shares)
    try:
        if args.checkin:
            state: Any = slot_shuffler.run(options, slot_shuffler.CheckinShuffleOptions(
                args.analyzer_key, args.model_topic, args.deployment, args.close_after,
                expect={"slot_length": args.batch_size, "params": args.params}))
        else:
            state = shuffler.run(options)
    finally:
        if stop_server is not None:
            stop_server()
    print(f"panpriv shuffle: released {state.released} rounds; {state.waiting} messages waiting; dropped "
          f"{dict(state.dropped) or 'none'}", flush=True)
    return EXIT_OK


# -- analyze ------------------------------------------------------------------------------------


def add_analyze(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    from panpriv.streamer.esa.families import FAMILIES

    names = ", ".join(FAMILIES)
    parser = commands.add_parser(
        "analyze", parents=parents, help=f"ESA analyzer ({names}): decrypt shuffled batches, step, publish",
        description="Read shuffled batches, open the messages with the private key(s), step the learner on the round "
        "(shuffle-gaussian: its valid messages; shuffle-acsa, shuffle-sgd, shuffle-gd: the sum of its users' shares; checkin: "
        "the slot's updates), checkpoint to --out and publish the next round's model. Resumes from --out. The learner is "
        "built as 'panpriv run --learner' builds it from the same settings (the intercept, radius sqrt(dim)).")
    _kafka(parser)
    parser.add_argument("--shuffled-topic", required=True, help="the shuffler's signed batches (read)")
    parser.add_argument("--model-topic", required=True, help="where each round's public model is published (compacted)")
    parser.add_argument("--messages-topic", required=True,
                        help="the clients' messages topic: names the data source in the budget store (not read)")
    keys = parser.add_mutually_exclusive_group(required=True)
    keys.add_argument("--analyzer-key", type=Path, action="append",
                      help="private key file (repeatable: the first is current, the others still accepted)")
    keys.add_argument("--analyzer-keys", type=Path, metavar="DIR",
                      help="every analyzer-*.key in DIR; the newest is current from the next round (rotation: keygen DIR, "
                      "restart)")
    parser.add_argument("--shuffler-verify-key", type=Path, action="append", required=True, metavar="PATH",
                        help="the shuffler's verify key (shuffler-<id>.verify), or a directory of them (repeatable): only "
                        "batches it signed for this deployment are learned")
    parser.add_argument("--out", type=Path, required=True, help="state directory (sealed analyzer.json; one process at a time)")
    _deployment(parser)
    parser.add_argument("--learner", choices=tuple(FAMILIES), default="shuffle-gaussian",
                        help="shuffle-acsa, shuffle-sgd, shuffle-gd: PVEC counts summed by split-and-mix shares (the "
                        "shuffler needs --shares); shuffle-gd: --batch-size is n, every user answers each of --rounds rounds; "
                        "checkin: random check-ins, --batch-size is slot_length (the shuffler needs --checkin)")
    parser.add_argument("--rounds", type=positive_int, help="shuffle-gd: T (default: Cheu et al. 2022 Thm 4.9's, capped)")
    parser.add_argument("--horizon", type=positive_int,
                        help="shuffle-acsa: n, the records of the whole protocol; shuffle-sgd: caps a planned batch size")
    parser.add_argument("--dim", type=positive_int, required=True, help="feature dimension of the records")
    parser.add_argument("--batch-size", type=positive_int, help="b (default: planned for (epsilon, delta))")
    parser.add_argument("--epsilon", type=positive_float, default=1.0, help="privacy epsilon per record (default 1)")
    parser.add_argument("--delta", type=positive_float, default=1e-6, help="privacy delta per record (default 1e-6)")
    parser.add_argument("--feature-bound", type=positive_float, default=1.0,
                        help="public bound on the l2 norm of x; clients clip to it (default 1)")
    parser.add_argument("--options", type=json_object, default="{}", help="more learner options as JSON, e.g. '{\"radius\": 4}'")
    parser.add_argument("--max-rounds", type=positive_int, help="exit once this many rounds are done")
    budget_flags(parser, "stop before a round whose records' epsilon, composed over all runs, would exceed this")
    metrics_flags(parser)
    parser.set_defaults(handler=cmd_analyze)


def analyzer_settings(args: argparse.Namespace) -> Any:
    """The :class:`~panpriv.streamer.runtime.learners.LearnerSettings` of ``panpriv analyze ARGS``:
    ``--batch-size`` is the constructor parameter the learner's family names (the stream length n
    for ``shuffle-gd``), ``--horizon`` the stream length, ``--rounds`` an option."""
    from panpriv.streamer.esa.families import family
    from panpriv.streamer.runtime.learners import LearnerSettings

    entry = family(args.learner)
    options = dict(args.options)
    n = args.horizon
    if args.batch_size is not None:
        if entry.batch_option in ("n", "horizon"):
            n = args.batch_size
        else:
            options.setdefault(entry.batch_option, args.batch_size)
    if args.rounds is not None:
        options.setdefault("rounds", args.rounds)
    return LearnerSettings(args.learner, args.dim, args.epsilon, args.delta, args.feature_bound, n, options)


def analyzer_learner(args: argparse.Namespace) -> Callable[[], Any]:
    """The learner ``panpriv analyze ARGS`` builds when it starts afresh (the one factory,
    :func:`panpriv.streamer.runtime.learners.build`)."""
    from panpriv.streamer.runtime.learners import arguments_for, build

    settings = analyzer_settings(args)
    arguments_for(settings)  # the flags are checked now, even when --out holds a state to resume
    return lambda: build(settings)


def cmd_analyze(args: argparse.Namespace) -> int:
    from panpriv.streamer.esa import analyze_service as service
    from panpriv.streamer.esa.families import family
    from panpriv.streamer.esa.keys import load_directory, load_private, load_verify_keys
    from panpriv.streamer.esa.metrics import AnalyzerMetrics

    learner = analyzer_learner(args)
    keys = load_directory(args.analyzer_keys) if args.analyzer_keys else [load_private(p) for p in args.analyzer_key]
    verify_keys = load_verify_keys(args.shuffler_verify_key)
    metrics = AnalyzerMetrics(family(args.learner).reject_reasons)
    metrics.set_info("analyzer", args.deployment, panpriv.__version__)
    stop_server = serve_metrics(metrics, args)
    try:
        result = service.run(service.AnalyzeOptions(
            args.bootstrap.split(","), args.shuffled_topic, args.model_topic, args.messages_topic, keys, verify_keys,
            args.out, learner, budget_settings(args), args.deployment, args.max_rounds, metrics))
    finally:
        if stop_server is not None:
            stop_server()
    state = result.analyzer
    print(f"panpriv analyze: {state.round} rounds done; rejected {dict(state.rejected) or 'none'}"
          + (f"\n  stopped  {result.stopped}" if result.stopped else "")
          + f"\n  privacy  {result.report.statement()}\n  budget   every use of this data source: panpriv budget", flush=True)
    return EXIT_OK


def add_all(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add the four ESA commands to the ``panpriv`` parser."""
    add_keygen(commands, parents)
    add_encode(commands, parents)
    add_shuffle(commands, parents)
    add_analyze(commands, parents)
