"""A busy metrics port: an error for a Kafka service (it would run unwatched), a warning for a replay."""

from __future__ import annotations

import socket
from pathlib import Path

from panpriv.streamer.commands.cli import main


def test_busy_port_is_an_error_in_service_mode(tmp_path: Path, capsys) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code = main(["run", "--source", "kafka://127.0.0.1:1/t?group=g", "--n", "10", "--dim", "2",
                     "--feature-bound", "1", "--metrics-port", str(port), "--out", str(tmp_path / "a")])
        assert code == 2
        assert f"metrics.port {port} on 127.0.0.1" in capsys.readouterr().err
        assert main(["-q", "run", "--source", "synthetic:n=50&dim=2", "--dim", "2", "--feature-bound", "1",
                     "--metrics-port", str(port), "--out", str(tmp_path / "b"), "--rate", "0"]) == 0
