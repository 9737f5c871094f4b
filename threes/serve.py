"""``threes serve CONFIG``: the pipeline's snapshots as a queryable replica, and ``threes query``'s client of it.

The process holds the same state store the stream job's lookups use, in a JVM with no Spark
(:mod:`stream_app.serve`), and answers ``GET /snapshots/...`` from it; it runs until SIGTERM or
Ctrl-C, which checkpoints every store.
"""

from __future__ import annotations

import json
import logging
import signal
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer

from kernel.config.endpoints import metrics_endpoint_problem
from kernel.exceptions import ConfigError, ConfigProblem, SetupError, ThreesError

log = logging.getLogger(__name__)

ConfigArg = Annotated[Path, typer.Argument(help="connector config YAML", show_default=False)]


def serve(
    config: ConfigArg,
    host: Annotated[
        str, typer.Option(help="the address to bind; any other than loopback needs stream.metrics_token")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="the port (0: any free one)", min=0, max=65535)] = 0,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="the stores' RocksDB folders (default .threes/serve/<job>)")
    ] = None,
    heap: Annotated[str, typer.Option(help="the JVM's heap (-Xmx), e.g. 2g")] = "1g",
) -> None:
    """Serve interactive queries of the pipeline's snapshots from a state store of their own (no Spark).

    GET /snapshots/{name}/{key}[?as_of=], /snapshots/{name}?from=&to=&limit=, /healthz, /readyz. A replica:
    run more of them (each with its own --state-dir) to serve more.
    """
    from stream_app.serve import default_state_dir
    from threes.console import console, fail, load

    pipeline = load(config)
    stream = pipeline.stream
    if stream is None:
        raise fail(ThreesError(f"{config}: no `stream:` section"))
    token = None if stream.metrics_token is None else stream.metrics_token.get_secret_value()
    problem = metrics_endpoint_problem(host, token)
    if problem:
        raise fail(ThreesError(f"--host {host}: {problem}"), 2)
    try:
        snapshots, consumer = _specs(pipeline, config)
    except ConfigError as exc:
        from kernel.config.loader import locate

        raise fail(ConfigError(locate(exc.problems, config))) from None
    except ThreesError as exc:
        raise fail(exc) from None
    folder = (state_dir or default_state_dir(stream.name)).resolve()
    try:
        server, bound = _start(pipeline, snapshots, consumer, folder, (host, port, token), heap)
    except SetupError as exc:
        raise fail(exc) from None
    typer.echo(f"serving {len(snapshots)} snapshot(s) on http://{host}:{bound} (state {folder}); loading", err=False)
    previous = signal.signal(signal.SIGTERM, lambda *_: server.process.terminate())
    try:
        for failed in server.wait_ready():
            console.print(f"[red]error[/red] {failed}", highlight=False)
        if server.process.poll() is None:
            typer.echo("ready")
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        code = server.stop()
        (folder / "server.json").unlink(missing_ok=True)
    if code not in (0, 143, -15):
        raise typer.Exit(1)


def _start(
    pipeline: Any, snapshots: list[Any], consumer: str, folder: Path, bind: tuple[str, int, str | None], heap: str
) -> tuple[Any, int]:
    """Start the JVM of ``threes serve`` and record where it listens: ``(StoreServer, port)``.

    Raises:
        SetupError: no Java, no lookup jar, or the process did not start.
    """
    from stream_app.serve import StoreServer, java_command, write_server_file, write_specs
    from threes.local.stack import resolved_spark_jars

    host, port, token = bind
    folder.mkdir(parents=True, exist_ok=True)
    command = java_command(resolved_spark_jars(), heap)
    spec_file = write_specs(snapshots, consumer, pipeline.kafka.schema_topic, folder)
    server = StoreServer(command, spec_file, host, port, token, folder / "serve.log")
    bound = server.wait_listening()
    write_server_file(folder, host, bound, server.process.pid)
    return server, bound


def _specs(pipeline: Any, config: Path) -> tuple[list[Any], str]:
    """The snapshots' store specs (the plan against the topics' writer schemas) and the consumer settings.

    Raises:
        ConfigError: a snapshot the JVM store cannot read, or the plan's problems.
    """
    from stream_app.kafka_io import TopicWatermarks
    from stream_app.plan import build_plan
    from stream_app.realtime import consumer_properties
    from stream_app.serve import store_specs, unservable
    from stream_app.writers import WriterSchemas, registry_subjects

    stream = pipeline.stream
    problems = unservable(stream)
    if problems:
        raise ConfigError([ConfigProblem(f"stream.{path}", message) for path, message in problems])
    writers = WriterSchemas(pipeline.kafka, TopicWatermarks(pipeline.kafka), registry_subjects(stream))
    plan = build_plan(stream, None, config.parent, writers.version_schemas)
    assert plan is not None  # with the writer versions every schema is known
    return store_specs(plan), consumer_properties(pipeline.kafka.librdkafka_config())


def query_server(
    base_url: str, snapshot: str, key: list[str], as_of: str | None, token: str | None, timeout_s: float = 30.0
) -> tuple[int, dict[str, Any]]:
    """Ask a running ``threes serve`` (or a job's query port) for one key: ``(HTTP status, JSON document)``.

    Args:
        base_url: e.g. ``http://127.0.0.1:8123``.
        snapshot: the snapshot's name.
        key: the key's value, or ``field=value`` per field of a composite key.
        as_of: the version's time (ISO-8601 or epoch ms), or ``None``.
        token: the bearer token, or ``None``.
        timeout_s: how long to wait for the answer, seconds.

    Raises:
        SetupError: the server cannot be reached.
    """
    params: dict[str, str] = {}
    path = f"/snapshots/{urllib.parse.quote(snapshot, safe='')}"
    if len(key) == 1 and "=" not in key[0]:
        path += "/" + urllib.parse.quote(key[0], safe="")
    else:
        for part in key:
            name, _, value = part.partition("=")
            params[name] = value
    if as_of is not None:
        params["as_of"] = as_of
    url = base_url + path + ("?" + urllib.parse.urlencode(params) if params else "")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, OSError) as exc:
        raise SetupError(f"threes serve at {base_url} cannot be reached: {exc}") from None


def register(app: typer.Typer) -> None:
    """Add ``threes serve`` to the CLI."""
    app.command(name="serve")(serve)
