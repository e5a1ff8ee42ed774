"""``panpriv report OUT [--to DIR]``: pictures of a run, from what it released.

Reads a run's output directory — ``snapshots.jsonl`` (records learned, the privacy report, the
time, the rejects count and, with ``--holdout``, the public hold-out scores of each snapshot) and
the checkpoint manifest (the totals) — and writes, in ``DIR`` (default ``OUT/report``):

- ``privacy.png``: ε of the output and of the intrusion guarantee against records learned, each
  labelled with its final δ, and the run's ``--max-epsilon`` as a line when it had one; the title
  names the learner and the final guarantee;
- ``holdout.png``: hold-out AUC and accuracy (and log-loss) per snapshot, when the run had
  ``--holdout``, against their baselines: AUC 1/2 (chance) and the hold-out's majority class;
- ``throughput.png``: records/s between snapshots and the rejected records, over the run's time;
- ``report.md``: the pictures and a table of the snapshots.

Everything it draws is a release or a public count (docs/privacy.md): drawing it costs nothing.
Needs matplotlib (``pip install 'panpriv[report]'``); it is imported only here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.sinks import read_snapshots


@dataclass(frozen=True)
class Point:
    """One snapshot, as the pictures use it."""

    sequence: int
    records: int
    rejected: int
    seconds: float  # since the first snapshot
    epsilon_output: float
    epsilon_intrusion: float
    delta_output: float
    delta_intrusion: float
    holdout: dict[str, float]


@dataclass(frozen=True)
class Run:
    """What the pictures say of the whole run: its learner, its budget limit, its snapshots."""

    learner: str
    max_epsilon: float | None
    points: list[Point]


def load_run(out: Path) -> Run:
    """The run in ``out`` (a directory or a snapshots.jsonl file): its snapshots, and the learner
    and budget limit its last snapshot records (the file is read once)."""
    path = out / "snapshots.jsonl" if out.is_dir() else out
    if not path.is_file():
        raise ConfigError(f"report: {out} holds no snapshots.jsonl (run `panpriv run --out {out}` first)")
    records = read_snapshots(path)
    if not records:
        raise ConfigError(f"report: {path} is empty: the run released no snapshot yet")
    start = _time(records[0]["created"])
    points = [
        Point(
            sequence=int(r["sequence"]),
            records=int(r["records"]),
            rejected=int(r.get("rejected", 0)),
            seconds=_time(r["created"]) - start,
            epsilon_output=float(r["privacy"]["output"]["epsilon"]),
            epsilon_intrusion=float(r["privacy"]["intrusion"]["epsilon"]),
            delta_output=float(r["privacy"]["output"]["delta"]),
            delta_intrusion=float(r["privacy"]["intrusion"]["delta"]),
            holdout={k: float(v) for k, v in r.get("holdout", {}).items() if k != "records"},
        )
        for r in records
    ]
    limit = records[-1].get("max_epsilon")
    return Run(str(records[-1].get("learner", "")), None if limit is None else float(limit), points)


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def write_report(out: Path, to: Path | None = None) -> list[Path]:
    """Write the pictures and the page for the run in ``out``; return the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("report: needs matplotlib; install it with pip install 'panpriv[report]'") from None
    run = load_run(out)
    points = run.points
    target = to if to is not None else (out if out.is_dir() else out.parent) / "report"
    target.mkdir(parents=True, exist_ok=True)
    written = [_privacy(plt, run, target / "privacy.png")]
    if any(p.holdout for p in points):
        written.append(_holdout(plt, points, target / "holdout.png"))
    written.append(_throughput(plt, points, target / "throughput.png"))
    page = target / "report.md"
    page.write_text(_page(out, points, [p.name for p in written]), encoding="utf-8")
    return [*written, page]


_BELOW = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.18), "ncol": 3, "frameon": False}
"""Legends of the two-axis pictures go under the plot, where they cannot hide a point."""


def _finite(values: list[float]) -> list[float]:
    return [v if math.isfinite(v) else float("nan") for v in values]


def _privacy(plt: Any, run: Run, path: Path) -> Path:
    """ε against records: the intrusion series is drawn under the output series, wider and paler,
    so it shows where the two are equal (most learners: one intrusion adds nothing)."""
    points, last = run.points, run.points[-1]
    figure, axes = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    records = [p.records for p in points]
    axes.step(records, _finite([p.epsilon_intrusion for p in points]), where="post", linewidth=6, alpha=0.35,
              color="tab:orange", label=f"one intrusion + outputs (final δ = {last.delta_intrusion:.3g})")
    axes.step(records, _finite([p.epsilon_output for p in points]), where="post", marker="o", color="tab:blue",
              label=f"outputs (final δ = {last.delta_output:.3g})")
    top = max(_finite_max([p.epsilon_intrusion for p in points] + [p.epsilon_output for p in points]), 1e-9)
    if run.max_epsilon is not None:
        axes.axhline(run.max_epsilon, color="tab:red", linestyle=":", label=f"--max-epsilon {run.max_epsilon:g}")
        top = max(top, run.max_epsilon)
    axes.set_ylim(0, top * 1.15)
    axes.set_xlabel("records learned")
    axes.set_ylabel("ε per record (composed over every run)")
    axes.set_title(f"{run.learner or 'panpriv'}: (ε, δ) at each snapshot — now outputs ({last.epsilon_output:.3g}, "
                   f"{last.delta_output:.3g}), intrusion ({last.epsilon_intrusion:.3g}, {last.delta_intrusion:.3g})",
                   fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(**_BELOW)
    return _save(plt, figure, path)


def _finite_max(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return max(finite, default=1.0)


def _holdout(plt: Any, points: list[Point], path: Path) -> Path:
    scored = [p for p in points if p.holdout]
    figure, axes = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    records = [p.records for p in scored]
    for metric, marker, color in (("auc", "o", "tab:blue"), ("accuracy", "s", "tab:green")):
        if any(metric in p.holdout for p in scored):
            axes.plot(records, [p.holdout.get(metric, float("nan")) for p in scored], marker=marker, color=color,
                      label=metric)
    if any("auc" in p.holdout for p in scored):
        axes.axhline(0.5, color="tab:blue", linestyle=":", linewidth=1, label="AUC of chance (1/2)")
    majority = [p.holdout["majority_accuracy"] for p in scored if "majority_accuracy" in p.holdout]
    if majority:  # a constant of the public hold-out file
        axes.axhline(majority[-1], color="tab:green", linestyle=":", linewidth=1,
                     label=f"majority class ({majority[-1]:.3f})")
    axes.set_xlabel("records learned")
    axes.set_ylabel("score on the public hold-out")
    axes.set_title("Hold-out scores of each released snapshot, against their baselines")
    axes.grid(alpha=0.3)
    if any("log_loss" in p.holdout for p in scored):
        other = axes.twinx()
        other.plot(records, [p.holdout.get("log_loss", float("nan")) for p in scored], color="grey", linestyle=":",
                   marker=".", label="log-loss (right)")
        other.set_ylabel("log-loss")
        lines = axes.get_legend_handles_labels()
        extra = other.get_legend_handles_labels()
        axes.legend(lines[0] + extra[0], lines[1] + extra[1], **_BELOW)
    else:
        axes.legend(**_BELOW)
    return _save(plt, figure, path)


def _throughput(plt: Any, points: list[Point], path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    pairs = list(zip(points, points[1:], strict=False))
    rates = [(b.records - a.records) / max(b.seconds - a.seconds, 1e-9) for a, b in pairs]
    if rates:  # each rate holds from one snapshot to the next
        times = [a.seconds for a, _ in pairs] + [pairs[-1][1].seconds]
        axes.step(times, rates + rates[-1:], where="post", label="records/s between snapshots")
    axes.set_xlabel("seconds since the first snapshot")
    axes.set_ylabel("records/s")
    axes.set_ylim(0, max(rates, default=1.0) * 1.15)
    axes.grid(alpha=0.3)
    other = axes.twinx()
    other.plot([p.seconds for p in points], [p.rejected for p in points], color="tab:red", marker="x",
               label="rejected records (total)")
    other.set_ylabel("rejected records")
    other.set_ylim(0, max(1, max(p.rejected for p in points)) * 1.1)
    other.yaxis.get_major_locator().set_params(integer=True)
    handles = axes.get_legend_handles_labels()
    extra = other.get_legend_handles_labels()
    axes.legend(handles[0] + extra[0], handles[1] + extra[1], **_BELOW)
    axes.set_title("Throughput and rejects")
    return _save(plt, figure, path)


def _save(plt: Any, figure: Any, path: Path) -> Path:
    figure.savefig(path, bbox_inches="tight")  # "tight": the legends below the axes are kept
    plt.close(figure)
    return path


def _page(out: Path, points: list[Point], pictures: list[str]) -> str:
    lines = [f"# panpriv run: {out}", "", f"{len(points)} snapshots; the last covers {points[-1].records:,} records.", ""]
    lines += [f"![{name}]({name})" for name in pictures] + [""]
    metrics = sorted({k for p in points for k in p.holdout})
    header = ["sequence", "records", "ε outputs", "ε intrusion", "rejected", *(f"hold-out {m}" for m in metrics)]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in points:
        cells = [str(p.sequence), f"{p.records:,}", f"{p.epsilon_output:.4g}", f"{p.epsilon_intrusion:.4g}", f"{p.rejected:,}"]
        cells += [f"{p.holdout[m]:.4f}" if m in p.holdout else "" for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
