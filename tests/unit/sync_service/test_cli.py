from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from threes.cli import app

CONFIG = """
kafka: {bootstrap_servers: "127.0.0.1:1"}
connections:
  db: {type: rds, url: "sqlite://"}
sync:
  - name: warehouse
    dead_letter_topic: updates.dlq
    sinks:
      - {name: t, type: rds_sink, connection: db, topics: [updates.t], table: t, key: [id]}
"""


def test_unknown_service_is_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(CONFIG)
    result = CliRunner().invoke(app, ["sync", "run", str(cfg), "--service", "nope"])
    assert result.exit_code == 1
    assert "no sync service named 'nope'" in result.output and "warehouse" in result.output


def test_invalid_sync_config_is_reported_with_its_path(tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(CONFIG.replace("dead_letter_topic: updates.dlq", "dead_letter_topic: updates.dlq\n    bogus: 1"))
    result = CliRunner().invoke(app, ["sync", "run", str(cfg)])
    assert result.exit_code == 1 and "p.yaml:8: sync[0].bogus: unknown key" in result.output
    cfg.write_text(CONFIG.replace("dead_letter_topic: updates.dlq", "dead_letter_topic: updates.dlq\n"
                                  "    max_poll_interval_ms: 10000\n    session_timeout_ms: 20000"))
    result = CliRunner().invoke(app, ["sync", "run", str(cfg)])
    assert result.exit_code == 1 and "max_poll_interval_ms must be >= session_timeout_ms" in result.output
