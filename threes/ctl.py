"""``threes ctl``: the management API of a running ``threes run`` from the command line.

``threes ctl list``, ``status NAME``, ``pause NAME``, ``resume NAME``, ``restart NAME``. Where
the API is: ``--url`` / ``$THREES_API_URL`` with ``--token`` / ``$THREES_API_TOKEN``, or
``--config CONFIG``: the run of that file, found through the file it writes beside its lock
(``<lock>.api.json``, readable by its owner only), with its token.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer

from kernel.exceptions import ThreesError

ctl_app = typer.Typer(
    help="Control a running `threes run`: list, status, pause, resume, restart its parts.", no_args_is_help=True
)

UrlOpt = Annotated[
    str | None, typer.Option("--url", envvar="THREES_API_URL", help="the run's API, e.g. http://127.0.0.1:8083")
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", envvar="THREES_API_TOKEN", show_envvar=True, help="its bearer token")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="find the API of the run of this YAML (its URL and token)")
]
NameArg = Annotated[str, typer.Argument(help="the part: sources, stream or sync", show_default=False)]


def locate(url: str | None, token: str | None, config: Path | None) -> tuple[str, str | None]:
    """``(base URL, token)`` of the API to call.

    Raises:
        ThreesError: neither ``--url`` nor a running ``threes run`` of ``config``.
    """
    if config is not None and url is None:
        from threes.pipeline.endpoint import read_discovery
        from threes.pipeline.lock import lock_path

        found = read_discovery(lock_path(config))
        if found is None:
            raise ThreesError(f"no `threes run` of {config} is running here (nothing beside {lock_path(config)})")
        return str(found["url"]), token or found.get("token")
    if url is None:
        raise ThreesError("say where the API is: --url (or $THREES_API_URL), or --config CONFIG of a running run")
    return url.rstrip("/"), token


def call(method: str, url: str, token: str | None, body: bytes | None = None, timeout_s: float = 60.0) -> Any:
    """One API request; returns its JSON answer.

    Raises:
        ThreesError: no answer, or an error answer (its ``error`` text and status).
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        headers["Content-Type"] = "application/yaml"
    request = urllib.request.Request(url, data=body, method=method, headers=headers)  # an operator-given URL
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            doc = json.loads(exc.read())
        except ValueError:
            doc = {}
        problems = doc.get("problems") or []
        raise ThreesError("\n".join([f"{exc.code}: {doc.get('error') or exc.reason}", *problems])) from None
    except (OSError, ValueError) as exc:
        raise ThreesError(f"the API at {url} does not answer: {getattr(exc, 'reason', exc)}") from None


def _show(doc: Any) -> None:
    from threes.console import out

    out.print_json(json.dumps(doc))


def _table(parts: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from threes.console import out

    table = Table("part", "state", "restarts", "lag", "config", "last error")
    for p in parts:
        table.add_row(
            p["name"],
            p["state"],
            str(p["restarts"]),
            "-" if p["lag"] is None else f"{p['lag']:,}",
            p["config_revision"],
            (p["last_error"] or "")[:120],
        )
    out.print(table)


def _run(method: str, path: str, url: str | None, token: str | None, config: Path | None) -> Any:
    from threes.console import fail

    try:
        base, key = locate(url, token, config)
        return call(method, base + path, key)
    except ThreesError as exc:
        raise fail(exc) from None


@ctl_app.command("list")
def list_parts(
    url: UrlOpt = None,
    token: TokenOpt = None,
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the API's JSON")] = False,
) -> None:
    """Every part of the run: state, restarts, lag, config revision, last error (GET /parts)."""
    parts = _run("GET", "/parts", url, token, config)
    _show(parts) if as_json else _table(parts)


@ctl_app.command()
def status(name: NameArg, url: UrlOpt = None, token: TokenOpt = None, config: ConfigOpt = None) -> None:
    """One part as JSON (GET /parts/NAME)."""
    _show(_run("GET", f"/parts/{name}", url, token, config))


@ctl_app.command()
def pause(name: NameArg, url: UrlOpt = None, token: TokenOpt = None, config: ConfigOpt = None) -> None:
    """Pause a part: the sources and the stream job stop cleanly; the sync services hold their partitions."""
    _show(_run("POST", f"/parts/{name}/pause", url, token, config))


@ctl_app.command()
def resume(name: NameArg, url: UrlOpt = None, token: TokenOpt = None, config: ConfigOpt = None) -> None:
    """Resume a paused part (POST /parts/NAME/resume)."""
    _show(_run("POST", f"/parts/{name}/resume", url, token, config))


@ctl_app.command()
def restart(name: NameArg, url: UrlOpt = None, token: TokenOpt = None, config: ConfigOpt = None) -> None:
    """Restart a part: a clean stop, then a start (POST /parts/NAME/restart)."""
    _show(_run("POST", f"/parts/{name}/restart", url, token, config))
