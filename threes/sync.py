"""``threes sync ...``: run the sync service."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

sync_app = typer.Typer(help="Run the sync service (update topics to RDS, Elasticsearch, S3).", no_args_is_help=True)

log = logging.getLogger(__name__)


@sync_app.command("run")
def run(
    config: Annotated[Path, typer.Argument(help="connector config YAML", show_default=False)],
    service: Annotated[
        str | None, typer.Option("--service", "-s", help="run only this sync service (default: all of them)")
    ] = None,
) -> None:
    """Run the config's sync services until SIGTERM/SIGINT, which flushes, commits and exits 0.

    Each service runs in its own thread with its own consumer group, so one
    target's trouble never holds up another's. A failed sink is restarted
    inside its service, a failed service by its supervisor, both with
    exponential backoff (``errors`` of each sink): nothing stops the others.
    """
    # handlers first: a SIGTERM while starting up also stops cleanly
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.warning("signal %d: flushing, committing and stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    from connectors.runtime.process import keep_pandas_out

    keep_pandas_out()  # pyarrow would load it for nothing: 44 MB of every sync process (process.py)
    from kernel.exceptions import ThreesError
    from sync_service.supervisor import ServiceSupervisor
    from threes.console import fail, load

    pipeline = load(config)
    chosen = [s for s in pipeline.sync if service is None or s.name == service]
    if not chosen:
        names = [s.name for s in pipeline.sync]
        raise fail(ThreesError(f"no sync service named {service!r} in {config} (have: {names})"))
    try:
        from kernel.kafka.topics import check_credentials

        # a refused login or broker certificate ends here, in one line (a broker that is down is retried)
        check_credentials(pipeline.kafka.librdkafka_config(), pipeline.kafka.request_timeout_s)
    except ThreesError as exc:
        raise fail(exc) from None
    errors: list[BaseException] = []

    def run_one(svc_config: object) -> None:
        try:
            ServiceSupervisor(pipeline.kafka, svc_config, dict(pipeline.connections)).run(stop)
        except Exception as exc:  # the supervisor itself failed (its port is taken...)
            log.error("sync service %s stopped: %s", getattr(svc_config, "name", "?"), exc)
            errors.append(exc)

    threads = [threading.Thread(target=run_one, args=(c,), name=f"sync-{c.name}") for c in chosen]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(0.2)
    if errors:
        raise fail(errors[0] if isinstance(errors[0], ThreesError) else ThreesError(str(errors[0])))
