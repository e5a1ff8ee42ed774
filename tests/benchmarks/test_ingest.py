"""The ingest benchmark's in-process decode+learn floor: the service's own codec and learner."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks import ingest


def test_decode_learn_times_the_services_codec_and_learner_on_every_record(tmp_path: Path, monkeypatch) -> None:
    seen: list[int] = []
    learner_class = type(ingest.build_learner(ingest.service_config("kafka://h:1/t", "binary", 5, 4096, tmp_path, "kafka-python"), 4096))
    learn_many = learner_class.learn_many

    def counted(self, X, y) -> None:  # noqa: ANN001
        seen.append(len(y))
        learn_many(self, X, y)

    monkeypatch.setattr(learner_class, "learn_many", counted)
    wall, cpu = ingest.decode_learn("binary", 5, 4096, tmp_path, rows=1024)
    assert seen == [1024] * 4  # four micro-batches of four 256-record messages, every record learned
    assert math.isfinite(wall) and math.isfinite(cpu) and wall > 0 and cpu > 0
    assert learner_class.__name__ == "PanPrivateACSA"  # the service's default learner, as the benchmark configures it
