"""The ``panpriv`` command line: parse, load the config, call one function per command.

Commands: ``run`` (the service), ``record`` (Kafka topic → replayable file), ``privacy`` (what-if
calculator), ``inspect`` (checkpoint or snapshot summary), ``budget`` (what every run spent, per
data source: :mod:`panpriv.streamer.budget.store`), ``produce`` (synthetic load generator,
:mod:`panpriv.streamer.commands.produce`), and the Encode–Shuffle–Analyze roles ``keygen``, ``encode``, ``shuffle``,
``analyze`` (:mod:`panpriv.streamer.esa`), the scale-out roles ``worker``, ``coordinate``, ``topics`` and
``dev-broker``. Exit codes: the one table of :mod:`panpriv.streamer.commands.exit_codes`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import sqlite3
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import panpriv
from panpriv.streamer.arg_types import positive_float
from panpriv.streamer.commands.exit_codes import EXIT_OK, EXIT_USAGE, exit_code
from panpriv.streamer.commands.help_text import DeprecatedFlag
from panpriv.streamer.commands.role_options import BUDGET_KAFKA_HELP, STATE_DIR_HELP
from panpriv.streamer.errors import ConfigError, StoppedDuringSetUp, StreamerError
from panpriv.streamer.io.urls import redact

log = logging.getLogger("panpriv")



# -- run ----------------------------------------------------------------------------------------


def _run_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {
        "source.url": args.source,
        "source.stop_at_end": True if args.stop_at_end else None,
        "source.accept_offset_reset": True if args.accept_offset_reset else None,
        "records.format": args.format,
        "records.dim": args.dim,
        "records.feature_bound": args.feature_bound,
        "records.schema_file": args.schema,
        "learner.name": args.learner,
        "learner.epsilon": args.epsilon,
        "learner.delta": args.delta,
        "learner.n": args.n,
        "learner.max_epsilon": args.max_epsilon,
        "learner.accept_larger_delta": True if args.accept_larger_delta else None,
        "learner.seed": args.seed,
        "out": args.out,
        "snapshots.every_records": args.snapshot_every,
        "snapshots.holdout": args.holdout,
        "checkpoint.every_records": args.checkpoint_every,
        "metrics.port": args.metrics_port if args.metrics_port not in (None, 0) else None,
        "metrics.textfile": args.metrics_textfile,
        "progress": args.progress,
        "budget.state_dir": args.state_dir,
        "status_interval_s": args.status_every,
    }
    if args.rate:  # 0 means "as fast as possible": applied after loading (see _load_run_config)
        overrides["source.rate"] = args.rate
    return overrides


def _load_run_config(args: argparse.Namespace) -> Any:
    from panpriv.streamer.config import ADULT_DEMO, load_config

    base = ADULT_DEMO if args.config is None and args.source is None else None
    overrides = _run_overrides(args)
    config = load_config(args.config, overrides, base=base)
    flags = _learner_option_flags(args)
    if flags:  # over the file's (or the demo's) [learner.options], key by key
        merged = _merge_options(dict(config.learner.options), flags)
        config = load_config(args.config, {**overrides, "learner.options": merged}, base=base)
    updates: dict[str, Any] = {}
    if args.rate == 0:
        updates["source"] = config.source.model_copy(update={"rate": None})
    if args.metrics_port == 0:
        updates["metrics"] = config.metrics.model_copy(update={"port": None})
    if config.out is None:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        updates["out"] = Path("out") / f"{config.learner.name}-{stamp}"
    return config.model_copy(update=updates) if updates else config


def _learner_option_flags(args: argparse.Namespace) -> dict[str, Any]:
    """``[learner.options]`` from the flags: ``--options JSON``, then each ``--set key=value``
    (a dotted key reaches into a table: ``loss.name=ridge``; the value is read as JSON, else kept
    as a string), then ``--radius`` and ``--intercept``/``--no-intercept`` (later flags win)."""
    options: dict[str, Any] = {}
    if args.options:
        try:
            parsed = json.loads(args.options)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--options: not valid JSON ({exc.msg} at character {exc.pos}); e.g. --options '{{\"radius\": 4}}'") from None
        if not isinstance(parsed, dict):
            raise ConfigError("--options: must be a JSON object, e.g. --options '{\"radius\": 4}'")
        options = _merge_options(options, parsed)
    for assignment in args.set or []:
        key, sep, text = assignment.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set radius=4 or --set loss.name=ridge")
        try:
            value: Any = json.loads(text)
        except json.JSONDecodeError:
            value = text
        *parents, leaf = key.split(".")
        node = options
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    if args.radius is not None:
        options["radius"] = args.radius
    if args.intercept is not None:
        options.setdefault("loss", {})["intercept"] = args.intercept
    return options


def _merge_options(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        merged[key] = _merge_options(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def cmd_run(args: argparse.Namespace) -> int:
    from panpriv.streamer.metrics.service import ServiceMetrics
    from panpriv.streamer.runtime.processor import Processor
    from panpriv.streamer.sources.base import display_name

    config = _load_run_config(args)
    metrics = ServiceMetrics()
    metrics.set_info(config.learner.name, display_name(config.source.url), panpriv.__version__)
    metrics.set_seeded(config.learner.seed is not None)
    metrics.set_epsilon_budget(config.learner.max_epsilon)
    if config.learner.seed is not None:
        from panpriv.protocols.randomness import SEEDED_WARNING

        log.warning("SEEDED MODE (--seed %d): %s; never use it for production data", config.learner.seed, SEEDED_WARNING)
    stop_server = None
    endpoint = None
    if config.metrics.port is not None:
        try:
            stop_server = metrics.serve(config.metrics.port, config.metrics.addr)
            endpoint = f"http://{config.metrics.addr}:{config.metrics.port}/metrics"
            log.info("metrics at %s", endpoint)
        except OSError as exc:
            # A service (Kafka source) is watched through its metrics: without them it would run
            # unmonitored, so a busy port is an error; a demo or replay only warns.
            if config.source.url.startswith("kafka://"):
                raise ConfigError(
                    f"metrics.port {config.metrics.port} on {config.metrics.addr}: {exc.strerror} (another panpriv or "
                    "exporter holds it?). Choose a free port with --metrics-port PORT, or --metrics-port 0 for none"
                ) from None
            log.warning("metrics endpoint not started (port %d: %s); continuing without it", config.metrics.port, exc.strerror)
    progress = config.progress == "on" or (config.progress == "auto" and sys.stderr.isatty())
    log.info("output directory: %s", config.out)
    from panpriv.streamer.runtime import allocator

    if allocator.wiping():
        log.info("memory: freed memory is overwritten (wiping allocator, panpriv.streamer.runtime.allocator)")
    else:
        log.warning("memory: the wiping allocator is off (%s): raw records read earlier may remain in freed memory",
                    "PANPRIV_ALLOCATOR=default" if allocator.supported() else "not Linux with glibc")
    started = time.monotonic()
    try:
        result = Processor(config, metrics=metrics, progress=progress).run()
    finally:
        if stop_server is not None:
            stop_server()
        if config.metrics.textfile is not None:
            metrics.write_textfile(str(config.metrics.textfile))
    log.info("learner %s ran with options %s", result.learner.name, _effective_options(result.learner))
    _print_summary(config, result, time.monotonic() - started, endpoint, args)
    return EXIT_OK


def _print_summary(config: Any, result: Any, seconds: float, endpoint: str | None, args: argparse.Namespace) -> None:
    from panpriv.streamer.sources.identity import IDENTIFICATION_RULE

    out = print
    rejected = sum(result.rejects.values())
    out("")
    out(f"panpriv run: {result.outcome.replace('_', ' ')} — {result.message} ({seconds:.1f} s)")
    out(f"  learner         {result.learner.name} (instance {result.instance})")
    out(f"  options         {_effective_options(result.learner)}")
    out(f"  source          {_display(config.source.url)}")
    reasons = ", ".join(f"{k}: {v:,}" for k, v in sorted(result.rejects.items()))
    out(f"  records learned {result.records:,}" + (f"; rejected {rejected:,} ({reasons})" if rejected else "; rejected 0"))
    if config.source.url == "adult:train" and result.records:
        from panpriv.streamer.serving.evaluation import compare_on_adult

        comparison = compare_on_adult(result.learner)
        out(f"  test accuracy on adult.test ({comparison.test_records:,} records):")
        rows = [
            (f"{result.learner.name} {result.report.output} (last snapshot)", comparison.private_accuracy),
            ("non-private logistic regression (L-BFGS)", comparison.baseline_accuracy),
            ("majority class", comparison.majority_accuracy),
        ]
        for name, accuracy in rows:
            out(f"    {name:<52} {accuracy:7.2%}")
    out("  privacy         " + result.report.statement())
    out(f"  budget store    {_state_dir(config)} (every run's use of these records: panpriv budget)")
    out(f"  identification  {IDENTIFICATION_RULE}")
    out(f"  checkpoint      {result.checkpoint_path}")
    if result.snapshot_path is not None:
        out(f"  snapshots       {result.snapshot_path} ({result.snapshots} emitted; last covers {result.last_snapshot['records']:,} records)" if result.last_snapshot else f"  snapshots       {result.snapshot_path}")
    if endpoint:
        out(f"  metrics         were served at {endpoint} while the run lasted")
    out(f"  inspect         panpriv inspect {config.out}")
    if result.outcome == "stopped":
        out(f"  resume          panpriv run {shlex.join(_resume_args(args, config))}")


def _effective_options(learner: Any) -> str:
    """The learner's constructor arguments as it runs (defaults included), ``key=value, …``."""
    return ", ".join(f"{key}={json.dumps(value, sort_keys=True)}" for key, value in sorted(learner.config().items()))


def _state_dir(config: Any) -> Path:
    from panpriv.streamer.budget.store import default_state_dir

    return Path(config.budget.state_dir or default_state_dir())


def _display(url: str) -> str:
    from panpriv.streamer.sources.base import display_name

    return display_name(url)


_GLOBAL_FLAGS_WITH_VALUES = ("--log-level", "--log-format")


def _after_command(argv: list[str]) -> list[str]:
    """The arguments after the subcommand (skipping the global flags before it and their values)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in _GLOBAL_FLAGS_WITH_VALUES else 1
    return argv[i + 1 :]


def _resume_args(args: argparse.Namespace, config: Any) -> list[str]:
    argv = [redact(a) for a in (args.argv or []) if a]
    if "--out" not in argv:
        argv += ["--out", str(config.out)]
    return argv


# -- record -------------------------------------------------------------------------------------


def cmd_record(args: argparse.Namespace) -> int:
    from panpriv.streamer.commands.record import record_topics

    count = record_topics(args.source, Path(args.path), timeout_s=args.timeout)
    print(f"panpriv record: wrote {count:,} messages to {args.path}")
    return EXIT_OK


# -- privacy ------------------------------------------------------------------------------------


def cmd_privacy(args: argparse.Namespace) -> int:
    from panpriv.streamer.commands.whatif import noise_to_epsilon, target_to_noise
    from panpriv.streamer.config import load_config

    if args.noise_multiplier is not None:
        epsilon = noise_to_epsilon(args.noise_multiplier, args.delta)
        if args.json:
            print(json.dumps({"noise_multiplier": args.noise_multiplier, "epsilon": epsilon, "delta": args.delta}))
            return EXIT_OK
        print(
            f"A Gaussian draw with standard deviation {args.noise_multiplier:g} x its l2 sensitivity is "
            f"(epsilon = {epsilon:.6g}, delta = {args.delta:g})-DP (Balle & Wang 2018, Thm 8)."
        )
        if args.learner == "pan-acsa":
            print(
                "For pan-acsa (each batch draw alone protects its batch; Cheu et al. 2022, Lemma C.4) this is the "
                "per-record guarantee for all outputs and for one intrusion plus all outputs."
            )
        return EXIT_OK
    overrides = {
        "source.url": "synthetic:n=1&dim=1",
        "records.format": "json",
        "records.dim": args.dim,
        "records.feature_bound": args.feature_bound,
        "learner.name": args.learner,
        "learner.epsilon": args.epsilon,
        "learner.delta": args.delta,
        "learner.options": json.loads(args.options) if args.options else None,
    }
    config = load_config(None, overrides)
    answer = target_to_noise(config, args.n)
    if args.json:
        print(json.dumps({
            "learner": args.learner, "n": args.n, "dim": args.dim, "feature_bound": args.feature_bound,
            "noise": list(answer.lines), "privacy": answer.report.to_dict(), "planned": answer.planned.to_dict(),
            "delta_above_request": answer.excess is not None, "warnings": list(answer.warnings),
        }))
        return EXIT_OK
    print(f"{args.learner} on n = {args.n:,} records of dimension {args.dim}, features clipped to norm {args.feature_bound:g}:")
    for line in answer.lines:
        print("  " + line)
    report = answer.report
    print(f"  outputs:   {report.output}")
    print(f"  intrusion: {report.intrusion}  (one read of the internal state plus all outputs)")
    planned = answer.planned
    if (planned.output, planned.intrusion) != (report.output, report.intrusion):
        print(f"  over the planned use (all n records, any snapshots): outputs {planned.output}, intrusion {planned.intrusion}")
    if answer.excess is not None:
        which, delta = answer.excess
        print(f"  WARNING: delta = {delta:.3g} for its {which} exceeds the requested {args.delta:g}; "
              "`panpriv run` refuses this unless --accept-larger-delta")
    for warning in answer.warnings:
        print(f"  WARNING: {warning}")
    print("  " + report.statement())
    return EXIT_OK


# -- inspect ------------------------------------------------------------------------------------


def cmd_report(args: argparse.Namespace) -> int:
    from panpriv.streamer.commands.report import write_report

    for path in write_report(args.out, args.to):
        print(path)
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from panpriv.streamer.commands.inspect import describe, summary

    print(json.dumps(summary(Path(args.path)), sort_keys=True) if args.json else describe(Path(args.path)))
    return EXIT_OK


# -- predict ------------------------------------------------------------------------------------


def cmd_predict(args: argparse.Namespace) -> int:
    """Score a source's records with a released snapshot: one JSON line per input record, in input
    order (its line number or id, and the prediction or the reason it was rejected); exit 2 when
    no record could be scored."""
    import numpy as np

    from panpriv.streamer.serving.snapshots import load_snapshot, predict_source

    snapshot = load_snapshot(args.snapshot, args.sequence)
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115 - closed below
    scored = rejected = unlabelled = correct = 0
    hits = [0, 0]  # correct among the labels' negatives, positives: the balanced accuracy
    counts = [0, 0]
    try:
        for part in predict_source(snapshot, args.source, args.format):
            out.writelines(json.dumps(line) + "\n" for line in part.lines)
            scored += len(part.predictions)
            rejected += part.rejected
            labelled = np.isfinite(part.labels)
            unlabelled += int((~labelled).sum())
            predictions, labels = part.predictions[labelled], part.labels[labelled]
            correct += int(np.sum((predictions > 0) == (labels > 0)))
            for cls, members in enumerate((labels <= 0, labels > 0)):
                counts[cls] += int(members.sum())
                hits[cls] += int(np.sum((predictions[members] > 0) == bool(cls)))
    finally:
        if out is not sys.stdout:
            out.close()
    assert snapshot.model is not None  # predict_source refuses a snapshot without one
    summary = (
        f"scored {scored:,} records ({rejected:,} rejected{f', {unlabelled:,} without a label' if unlabelled else ''}) "
        f"with the {snapshot.learner} snapshot of {snapshot.records:,} records"
    )
    if snapshot.model.loss.binary_labels and scored > unlabelled:
        summary += f"; accuracy against the source's own labels: {correct / (scored - unlabelled):.2%}"
        if all(counts):  # both classes present: the mean of the two classes' accuracies (threshold P = 1/2)
            summary += f", balanced accuracy {0.5 * (hits[0] / counts[0] + hits[1] / counts[1]):.2%}"
    if not scored:
        print(
            f"panpriv predict: error: no record of {args.source} could be scored ({rejected:,} rejected: see the "
            "\"rejected\" reasons in the output); check --format and that the records match the snapshot's model",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not args.quiet:
        print(summary, file=sys.stderr)
    return EXIT_OK


# -- budget -------------------------------------------------------------------------------------


def cmd_budget(args: argparse.Namespace) -> int:
    from panpriv.streamer.budget.store import default_state_dir, describe_opened, describe_store

    if args.budget_kafka:
        from panpriv.streamer.budget.kafka_store import KafkaBudgetStore
        from panpriv.streamer.io.source_url import parse_kafka_url

        spec = parse_kafka_url(args.budget_kafka)
        print(describe_opened(KafkaBudgetStore(spec.bootstrap, spec.topics[0]), args.source))
    else:
        print(describe_store(Path(args.state_dir or default_state_dir()), args.source))
    return EXIT_OK


# -- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from panpriv.streamer.commands.logs import FORMATS as LOG_FORMATS
    from panpriv.streamer.commands.logs import LEVELS as LOG_LEVELS
    from panpriv.streamer.config import LEARNER_NAMES, RecordFormat

    parser = argparse.ArgumentParser(
        prog="panpriv",
        description="Streaming, pan-private learning with exact privacy accounting.",
    )
    parser.add_argument("--version", action="version", version=f"panpriv {panpriv.__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, help="log level (default INFO; -q: WARNING)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, help="text (default) or json: one JSON object per line")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # The global flags are accepted after the subcommand too (`panpriv run -q`); SUPPRESS keeps a
    # subcommand from resetting a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="log warnings and errors only")
    common.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=argparse.SUPPRESS, help="log level (default INFO; -q: WARNING)")
    common.add_argument("--log-format", choices=LOG_FORMATS, default=argparse.SUPPRESS, help="text (default) or json: one JSON object per line")
    # The commands that only talk to Kafka read the [kafka] section (TLS, SASL, options) of a config file.
    kafka_only = argparse.ArgumentParser(add_help=False)
    kafka_only.add_argument("--config", dest="kafka_config", type=Path, metavar="TOML",
                            help="read the [kafka] section (TLS, SASL, client options) of this file; PANPRIV_KAFKA__* variables override it")

    run = commands.add_parser(
        "run",
        parents=[common],
        help="run the service (default: replay UCI Adult through pan-private AC-SA)",
        description=(
            "Consume records, learn with only noisy state, checkpoint, and emit snapshots with their "
            "privacy report. Without --config and --source: replay the embedded UCI Adult training "
            "set through pan-private AC-SA at epsilon = 1, delta = 1e-6. Flags override the config file."
        ),
    )
    run.add_argument("--config", type=Path, help="TOML configuration file (see README 'Configuring')")
    run.add_argument("--source", help="kafka://host:port/topic[,topic]?group=G | file:PATH | synthetic:n=N&dim=D[&seed=S] | adult:train")
    run.add_argument("--learner", choices=LEARNER_NAMES, help="learner name (default pan-acsa)")
    run.add_argument("--epsilon", type=positive_float, help="privacy epsilon per record (default 1)")
    run.add_argument("--delta", type=positive_float, help="privacy delta per record (default 1e-6)")
    run.add_argument("--n", type=int, help="public stream length (required for Kafka sources)")
    run.add_argument("--max-epsilon", type=positive_float, help="stop before the composed epsilon would exceed this")
    run.add_argument("--accept-larger-delta", action="store_true",
                     help="run a learner whose guarantee can exceed --delta (PNSGD without a pan floor); refused otherwise")
    run.add_argument("--out", type=Path, help="directory for checkpoints and snapshots (resumes if it holds a checkpoint)")
    run.add_argument("--snapshot-every", type=int, metavar="RECORDS", help="emit a snapshot at most every RECORDS records")
    run.add_argument("--holdout", type=Path, metavar="FILE",
                     help="score each snapshot on this PUBLIC labelled file (never the private stream): AUC, accuracy, log-loss")
    run.add_argument("--checkpoint-every", type=int, metavar="RECORDS", help="checkpoint at most every RECORDS records")
    run.add_argument("--metrics-port", type=int, help="Prometheus endpoint port (0: none; default 9477)")
    run.add_argument("--metrics-textfile", type=Path, metavar="PATH", help="also write the metrics to PATH at the end (node_exporter textfile collector; short replays)")
    run.add_argument("--rate", type=float, help="records per second (0: as fast as possible)")
    run.add_argument("--stop-at-end", action="store_true", help="Kafka: exit once every partition of the topics is caught up")
    run.add_argument("--accept-offset-reset", action="store_true", help="Kafka: read on when a topic's offsets went back below the checkpoint (re-created topic); the ledger charges those offsets again")
    run.add_argument("--format", choices=get_args(RecordFormat),
                     help="record encoding (default: from the source); json-batch, ndjson, csv-batch: many records per message")
    run.add_argument("--dim", type=int, help="feature dimension")
    run.add_argument(
        "--schema", type=Path, metavar="FILE",
        help="a JSON or TOML file mapping named fields (JSON objects, CSV rows named by a header) to features; sets --dim",
    )
    run.add_argument("--feature-bound", type=positive_float, help="public bound on the l2 norm of x (records are clipped to it)")
    run.add_argument("--seed", type=int, help="TEST/REPLAY ONLY: seed the noise (no pan-private guarantee)")
    run.add_argument("--options", metavar="JSON", help='learner options as a JSON object over the config\'s, e.g. \'{"eta": 0.1, "radius": 4}\'')
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="one learner option (repeatable; a dotted key reaches a table: loss.name=ridge)")
    run.add_argument("--radius", type=positive_float, help="radius of the parameter ball (learner.options.radius; a PUBLIC bound chosen before seeing the data)")
    run.add_argument("--intercept", action=argparse.BooleanOptionalAction, default=None,
                     help="learn an intercept (the default; --no-intercept: learner.options.loss.intercept = false)")
    run.add_argument("--progress", choices=["auto", "on", "off"], help="progress line on stderr (default auto: on a terminal)")
    run.add_argument("--state-dir", type=Path, help=STATE_DIR_HELP)
    run.add_argument("--status-every", type=float, metavar="SECONDS", help="off a terminal, log a status line this often (default 30; 0: never)")
    run.set_defaults(handler=cmd_run)

    record = commands.add_parser(
        "record",
        parents=[common, kafka_only],
        help="copy a Kafka topic to a replayable file (offsets and timestamps kept)",
        description="Read every partition of the topic(s) from its first to its current last offset and write a recording for 'panpriv run --source file:PATH' (offsets and timestamps kept).",
    )
    record.add_argument("source", help="kafka://host:port/topic[,topic]")
    record.add_argument("path", help="output file")
    record.add_argument("--timeout", type=positive_float, default=60.0, help="give up after this many seconds without progress (default 60)")
    record.set_defaults(handler=cmd_record)

    privacy = commands.add_parser(
        "privacy",
        parents=[common],
        help="what-if calculator: target -> noise, or noise -> guarantee",
        description=(
            "Target -> noise: the learner's planned batches, the standard deviation of each noise draw, and "
            "both guarantees for (n, epsilon, delta). Noise -> guarantee: --noise-multiplier Z gives the "
            "epsilon of a Gaussian draw with standard deviation Z x sensitivity at --delta."
        ),
    )
    privacy.add_argument("--learner", choices=LEARNER_NAMES, default="pan-acsa", help="learner to plan (default pan-acsa)")
    privacy.add_argument("--n", type=int, default=32_561, help="public stream length (default: Adult's 32,561)")
    privacy.add_argument("--epsilon", type=positive_float, default=1.0, help="target epsilon per record (default 1)")
    privacy.add_argument("--delta", type=positive_float, default=1e-6,
                         help="target delta per record (default 1e-6); with --noise-multiplier, the delta of the answer")
    privacy.add_argument("--dim", type=int, default=105, help="feature dimension (default: the Adult encoding's 105)")
    privacy.add_argument("--feature-bound", type=positive_float, default=math.sqrt(14), help="l2 bound on features (default: the Adult encoding's sqrt(14))")
    privacy.add_argument("--options", help='learner options as JSON, e.g. \'{"radius": 16}\'')
    privacy.add_argument("--noise-multiplier", type=positive_float, help="noise -> guarantee for this sigma/sensitivity")
    privacy.add_argument("--json", action="store_true", help="one JSON object (noise lines and the privacy report) instead of text")
    privacy.set_defaults(handler=cmd_privacy)

    from panpriv.streamer.commands import produce as load

    produce = commands.add_parser("produce", parents=[common, kafka_only], help=load.HELP, description=load.DESCRIPTION)
    load.add_produce_arguments(produce)
    produce.set_defaults(handler=load.run_produce)

    from panpriv.streamer.commands import dev_broker

    broker = commands.add_parser("dev-broker", parents=[common], help=dev_broker.HELP, description=dev_broker.DESCRIPTION)
    dev_broker.add_arguments(broker)
    broker.set_defaults(handler=dev_broker.run)

    from panpriv.streamer.commands import esa

    esa.add_all(commands, [common, kafka_only])

    from panpriv.streamer.commands import topics

    topics.add_topics(commands, [common, kafka_only])

    from panpriv.streamer.commands import scaleout

    scaleout.add_all(commands, [common, kafka_only])

    inspect = commands.add_parser(
        "inspect",
        parents=[common],
        help="summarise a checkpoint, a snapshots file, or an output directory",
        description="Summarise a checkpoint manifest, a snapshots JSONL file, or a --out directory holding both.",
    )
    inspect.add_argument("path", help="a checkpoint manifest, a snapshots.jsonl, or a --out directory of panpriv run")
    inspect.add_argument("--json", action="store_true", help="one JSON object instead of text (for scripts)")
    inspect.set_defaults(handler=cmd_inspect)

    report = commands.add_parser(
        "report",
        parents=[common],
        help="pictures of a run: privacy, hold-out scores, throughput and rejects (needs panpriv[report])",
        description="Draw a run's released snapshots: PNGs and a markdown page, in --to (default OUT/report). Only "
        "released snapshots are read: no privacy cost.",
    )
    report.add_argument("out", type=Path, help="a --out directory of panpriv run (or its snapshots.jsonl)")
    report.add_argument("--to", type=Path, help="where to write (default: OUT/report)")
    report.set_defaults(handler=cmd_report)

    predict = commands.add_parser(
        "predict",
        parents=[common],
        help="score records with a released snapshot (same clipping as training; no privacy cost)",
        description=(
            "Load a snapshot from a snapshots JSONL file (the last one, or --sequence N) and write one JSON line per "
            "record of --source, in input order: its line number (or its id, when the snapshot's schema names an id "
            "field) and the prediction (a label +1/-1 for classification losses, else the value) with, for the "
            "logistic loss, the probability of +1 — or the reason the record was rejected. Records need no label. "
            "Exit 2 when no record could be scored."
        ),
    )
    predict.add_argument("--snapshot", type=Path, required=True, help="a snapshots.jsonl written by panpriv run --out")
    predict.add_argument("--sequence", type=int, help="the snapshot that follows this checkpoint sequence (default: the last)")
    predict.add_argument("--source", required=True, help="file:PATH (JSONL, CSV, recording) or adult:test")
    predict.add_argument("--format", choices=("json", "csv", "binary", "adult"), help="record format (default: inferred)")
    predict.add_argument("--out", type=Path, help="write predictions here instead of stdout")
    predict.set_defaults(handler=cmd_predict)

    budget = commands.add_parser(
        "budget",
        parents=[common, kafka_only],
        help="what every run spent, per data source (the budget store)",
        description=(
            "List every data source in the budget store (Kafka cluster/topic/partition, a file's content hash), "
            "its position ranges, which runs used them, and the guarantee composed over all of them; then the runs."
        ),
    )
    budget.add_argument("--source", help="only data keys containing this text (e.g. a topic name)")
    store = budget.add_mutually_exclusive_group()
    store.add_argument("--state-dir", type=Path, help=STATE_DIR_HELP)
    store.add_argument("--budget-kafka", metavar="URL", help=BUDGET_KAFKA_HELP)
    store.add_argument("--kafka", dest="budget_kafka", action=DeprecatedFlag, use="--budget-kafka URL")
    budget.set_defaults(handler=cmd_budget)
    from panpriv.streamer.commands import help_text

    help_text.finish(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``panpriv`` console script: one line per error, the exit codes of
    :mod:`panpriv.streamer.commands.exit_codes`."""
    program = argv is None  # started as the program (not called from Python)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if program:
        from panpriv.streamer.runtime import allocator

        allocator.ensure(args.command)  # a long-running command restarts with an allocator that erases (docstring)
    args.argv = _after_command(argv) if args.command == "run" else []
    from panpriv.streamer.commands import logs

    logs.setup(args.log_level or ("WARNING" if args.quiet else "INFO"), args.log_format or "text")
    try:
        if hasattr(args, "kafka_config"):
            from panpriv.streamer.config import load_kafka_config
            from panpriv.streamer.kafka import client as kafka_client

            kafka_client.configure(load_kafka_config(args.kafka_config))
        return int(args.handler(args))
    except BaseException as exc:  # noqa: BLE001 - every error is one line and a code of the table; a bug is re-raised
        code = exit_code(exc)
        if code is None:  # a bug (or argparse's own SystemExit): the traceback is the report
            raise
        line = error_line(exc)
        if line:
            print(f"panpriv {args.command}: {line}", file=sys.stderr)
        return code


def error_line(exc: BaseException) -> str:
    """The one line printed for ``exc`` (redacted: no credentials of a URL)."""
    from panpriv.streamer.budget.store import BudgetExceededError

    if isinstance(exc, BudgetExceededError):
        return str(exc)
    if isinstance(exc, StoppedDuringSetUp):
        return "stopped during set-up; nothing was learned"
    if isinstance(exc, KeyboardInterrupt):
        return ""
    if isinstance(exc, sqlite3.Error):  # the budget store failed (full disk, locked or damaged file)
        return (f"error: the privacy budget store failed ({exc}); nothing was learned past its last charge. Check free "
                "space and permissions of the state directory (--state-dir), then run the same command again")
    if isinstance(exc, TimeoutError):  # a wait with a deadline (a model that never came): its own words
        return f"error: {exc}"
    if isinstance(exc, OSError) and not isinstance(exc, StreamerError):  # a file error: one line, no traceback
        from panpriv.streamer.ioerrors import describe

        return f"error: {redact(describe(exc))}"
    from kafka.errors import KafkaError

    if isinstance(exc, KafkaError):
        return f"Kafka error: {redact(str(exc))}"
    if isinstance(exc, StreamerError) or exit_code(exc) is not None:
        return f"error: {redact(str(exc))}"
    return ""


if __name__ == "__main__":
    sys.exit(main())
