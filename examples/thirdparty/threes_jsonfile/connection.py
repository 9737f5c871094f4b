"""The ``jsonfile`` connection: a local folder, its check, and how a connector opens it."""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from kernel.config.models import CheckResult, ConnectionConfig, ConnectorConfig
from kernel.exceptions import SetupError

TOKEN_FILE = ".token"
"""A folder holding this file accepts only connections whose ``token`` equals its content."""


class JsonfileConnection(ConnectionConfig):
    """A folder of JSON files, e.g. ``connections: {files: {type: jsonfile, root: ./data, token: ${env:TOKEN}}}``."""

    type: Literal["jsonfile"]
    root: str = Field(description="the folder; its sub-folders are the connectors' paths")
    token: SecretStr | None = Field(None, description="must equal the folder's .token file when it has one")

    def check(self, name: str, users: Sequence[ConnectorConfig]) -> list[CheckResult]:
        """Whether the folder exists and accepts the token (read-only, for ``threes check``)."""
        try:
            folder = open_folder(self)
        except SetupError as exc:
            return [CheckResult("jsonfile", name, False, str(exc), f"check connections.{name}.root and token")]
        return [CheckResult("jsonfile", name, True, f"folder {folder} is readable")]


def open_folder(conn: JsonfileConnection) -> Path:
    """The connection's folder, once it accepted the token.

    Returns:
        The folder's absolute path.

    Raises:
        SetupError: the folder is missing, or its ``.token`` refuses the connection's token
            (the message never holds the token).
    """
    folder = Path(conn.root).expanduser().resolve()
    if not folder.is_dir():
        raise SetupError(f"jsonfile folder {folder} does not exist")
    guard = folder / TOKEN_FILE
    if guard.is_file():
        given = conn.token.get_secret_value() if conn.token is not None else ""
        if not hmac.compare_digest(given.encode(), guard.read_text().strip().encode()):
            raise SetupError(f"jsonfile folder {folder}: the token was refused")
    return folder
