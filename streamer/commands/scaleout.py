"""``panpriv worker`` and ``panpriv coordinate``: one pan-private AC-SA model on many processes
(:mod:`panpriv.streamer.scaleout`; Cheu et al. 2022 Alg. 6). Wired into :mod:`panpriv.streamer.commands.cli`."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import panpriv
from panpriv.streamer.arg_types import json_object, non_negative_float, positive_float, positive_int
from panpriv.streamer.commands.exit_codes import EXIT_OK
from panpriv.streamer.commands.role_options import budget_flags, budget_settings
from panpriv.streamer.metrics.roles import RoleMetrics, metrics_flags, serve_metrics

log = logging.getLogger("panpriv.scaleout")


def _topics(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="Kafka brokers, host:port[,host:port]")
    parser.add_argument("--gradients-topic", required=True, help="noisy batch means (one partition)")
    parser.add_argument("--model-topic", required=True, help="the model's versions (compacted, one partition)")
    parser.add_argument("--deployment", default="default", help="the model's name: the key on both topics")
    metrics_flags(parser)


def _serve_metrics(metrics: RoleMetrics, role: str, args: argparse.Namespace) -> Callable[[], None] | None:
    """Label a role's metrics and serve them (:func:`panpriv.streamer.metrics.roles.serve_metrics`)."""
    metrics.set_info(role, args.deployment, panpriv.__version__)
    return serve_metrics(metrics, args)


def add_worker(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "worker", parents=parents, help="scale-out: a consumer-group member publishing noisy batch means",
        description="Consume the data topic in a consumer group; per batch of the size the model names, run Cheu et al. "
        "2022 Alg. 6 lines 4-9 at the newest model version and publish only the noisy mean to the gradients topic. "
        "Charges what it reads to the budget store before learning it.")
    _topics(parser)
    parser.add_argument("--data-topic", required=True, help="the records, JSON {\"x\": [...], \"y\": ±1} (or --format csv)")
    parser.add_argument("--group", default="panpriv-workers", help="the workers' consumer group")
    parser.add_argument("--format", choices=("json", "csv"), default="json", help="one record per message")
    parser.add_argument("--out", type=Path, help="the worker's state (its budget instance): a restart with the same "
                        "--out accounts a batch lost in a crash as intrusion-only")
    budget_flags(parser, "refuse a model whose epsilon, or records whose budget over all runs, exceed this")
    parser.add_argument("--sync-wait", type=positive_float, default=2.0,
                        help="seconds after publishing before another batch at the same version, if a place is left there "
                        "(a worker gone); the open batch's lease is renewed every quarter of it (default 2)")
    parser.add_argument("--rate", type=float, default=0.0, help="at most this many records/s (default 0: unpaced)")
    parser.set_defaults(handler=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    from panpriv.streamer.scaleout import worker
    from panpriv.streamer.scaleout.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    metrics.set_epsilon_budget(args.max_epsilon)
    stop_server = _serve_metrics(metrics, "worker", args)
    try:
        stats = worker.run(worker.WorkerOptions(
            args.bootstrap.split(","), args.data_topic, args.gradients_topic, args.model_topic, args.deployment, args.group,
            budget_settings(args), args.out, args.sync_wait, args.format, args.rate, metrics if stop_server else None))
    finally:
        if stop_server is not None:
            stop_server()
    print(f"panpriv worker: {stats.instance}: published {stats.published} noisy batch means ({stats.records:,} records); "
          f"rejected {stats.rejected}; batches lost {stats.discarded}" + (f"; {stats.reason}" if stats.reason else ""), flush=True)
    return EXIT_OK


def add_coordinate(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "coordinate", parents=parents, help="scale-out: combine K noisy means per step, publish the model",
        description="Read noisy batch means, step the model once K means of the current version are in (synchronous "
        "versions), publish each version to the compacted model topic. Resumes from the model topic. The learner is "
        "built as 'panpriv run --learner' builds it from the same settings (the intercept, radius sqrt(dim)).")
    _topics(parser)
    parser.add_argument("--workers", type=positive_int, required=True, help="K: means per step")
    parser.add_argument("--learner", default="pan-acsa", help="a learner that runs on many workers (default pan-acsa)")
    parser.add_argument("--dim", type=positive_int, required=True, help="feature dimension of the records")
    parser.add_argument("--n", type=positive_int, required=True, help="the planned stream length (records)")
    parser.add_argument("--epsilon", type=positive_float, default=1.0, help="privacy epsilon per record (default 1)")
    parser.add_argument("--delta", type=positive_float, default=1e-6, help="privacy delta per record (default 1e-6)")
    parser.add_argument("--feature-bound", type=positive_float, default=1.0,
                        help="public bound on the l2 norm of x; workers clip to it (default 1)")
    parser.add_argument("--options", type=json_object, default="{}", help="more learner options as JSON, e.g. '{\"loss\": \"hinge\"}'")
    parser.add_argument("--max-steps", type=positive_int, help="stop after this many steps (default: the planned epoch)")
    parser.add_argument("--stall-timeout", type=non_negative_float, default=None, metavar="SECONDS",
                        help="end with exit code 4 when nothing moves toward the next version for this long: every "
                        "worker gone, or too few records left (default 600; 0: wait for ever)")
    parser.set_defaults(handler=cmd_coordinate)


def coordinator_settings(args: argparse.Namespace) -> Any:
    """The :class:`~panpriv.streamer.runtime.learners.LearnerSettings` of ``panpriv coordinate ARGS``."""
    from panpriv.streamer.runtime.learners import LearnerSettings

    return LearnerSettings(args.learner, args.dim, args.epsilon, args.delta, args.feature_bound, args.n, dict(args.options))


def coordinator_learner(args: argparse.Namespace) -> Callable[[], Any]:
    """The learner ``panpriv coordinate ARGS`` builds when the model topic is empty (the one factory,
    :func:`panpriv.streamer.runtime.learners.build`), checked now: it must run on many workers."""
    from panpriv.protocols.batch_worker import supports_batch_workers
    from panpriv.streamer.errors import ConfigError
    from panpriv.streamer.runtime.learners import arguments_for, build, learner_class
    from panpriv.streamer.scaleout.coordinator import batch_worker_names

    settings = coordinator_settings(args)
    if not supports_batch_workers(learner_class(settings.name)):
        raise ConfigError(f"--learner {settings.name}: it cannot run on many workers; these can: "
                          f"{', '.join(batch_worker_names())}")
    arguments_for(settings)
    return lambda: build(settings)


def cmd_coordinate(args: argparse.Namespace) -> int:
    from panpriv.streamer.scaleout import coordinator
    from panpriv.streamer.scaleout.metrics import CoordinatorMetrics

    learner = coordinator_learner(args)
    metrics = CoordinatorMetrics()
    stop_server = _serve_metrics(metrics, "coordinator", args)
    try:
        state = coordinator.run(coordinator.CoordinateOptions(
            args.bootstrap.split(","), args.gradients_topic, args.model_topic, args.deployment, args.workers, learner,
            args.max_steps, metrics,
            coordinator.STALL_TIMEOUT_S if args.stall_timeout is None else args.stall_timeout))
    finally:
        if stop_server is not None:
            stop_server()
    print(f"panpriv coordinate: version {state.version} ({state.records:,} records, {state.stale} stale means)"
          f"{' — done' if state.done else ''}\n  privacy  {state.report().statement()}", flush=True)
    return EXIT_OK


def add_all(commands: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``worker`` and ``coordinate`` to the ``panpriv`` parser."""
    add_worker(commands, parents)
    add_coordinate(commands, parents)


__all__ = ["add_all"]
