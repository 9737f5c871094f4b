"""Elasticsearch 9.5.4 (the minimal integ-test distribution) on 127.0.0.1:19200.

The zip comes from Maven (9.x downloads only when named exactly) and is
unzipped into a temporary folder renamed into place, so a half-unzipped copy
never looks installed. Elasticsearch refuses to run as root: when we are root it
runs as the system user ``threes-es``, which owns ``.threes/elasticsearch``.
It needs Java 21+ (``ES_JAVA_HOME``; Temurin 25 here).

The minimal distribution answers 405 on ``GET /``: readiness is
``cluster.health(wait_for_status="yellow")``.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit

from .common import HOST, LocalStackError
from .maven import copy_artifact
from .process import port_open
from .service import Service
from .system import as_user, chown_tree, ensure_system_user, find_java, make_traversable

if TYPE_CHECKING:
    from .endpoints import Endpoints

logger = logging.getLogger(__name__)

ES_VERSION = "9.5.4"
ES_ARTIFACT = f"org.elasticsearch.distribution.integ-test-zip:elasticsearch:{ES_VERSION}:zip"
HTTP_PORT = 19200
TRANSPORT_PORT = 19300
OS_USER = "threes-es"
TEMURIN_25 = "/usr/lib/jvm/temurin-25-jdk-amd64"
HEAP = ("-Xms512m", "-Xmx512m")


def unzip(archive: Path, target: Path) -> None:
    """Extract ``archive`` into ``target`` keeping Unix permissions (``bin/`` scripts).

    Args:
        archive: The zip file.
        target: Folder to extract into (created).

    Raises:
        LocalStackError: If the archive is corrupt.
    """
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                path = Path(zf.extract(info, target))
                mode = (info.external_attr >> 16) & 0o7777
                if mode and not stat.S_ISLNK(info.external_attr >> 16):
                    os.chmod(path, mode)
    except (zipfile.BadZipFile, OSError) as exc:
        raise LocalStackError(f"cannot unzip {archive} ({exc}); delete it and run up again") from exc


class Elasticsearch(Service):
    """A single-node Elasticsearch cluster without security (local use only)."""

    name = "elasticsearch"
    title = "Elasticsearch"
    env_var = "THREES_ELASTICSEARCH_URL"
    endpoint_vars: ClassVar[dict[str, str]] = {"elasticsearch_url": "THREES_ELASTICSEARCH_URL"}
    ports = (HTTP_PORT, TRANSPORT_PORT)
    health_timeout = 180.0
    stop_timeout = 45.0
    run_as = OS_USER

    @property
    def install_dir(self) -> Path:
        """The unzipped distribution."""
        return self.dir / f"elasticsearch-{ES_VERSION}"

    def install(self) -> None:
        """Download and unzip the distribution (each step skipped when done).

        Raises:
            LocalStackError: If the download or the unzip fails.
        """
        if (self.install_dir / "bin" / "elasticsearch").exists():
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        archive = copy_artifact(
            self.layout,
            ES_ARTIFACT,
            self.layout.downloads / f"elasticsearch-{ES_VERSION}.zip",
            log_name="elasticsearch",
        )
        logger.info("elasticsearch: unzipping %s", archive.name)
        tmp = self.dir / ".unzip"
        shutil.rmtree(tmp, ignore_errors=True)
        unzip(archive, tmp)
        shutil.rmtree(self.install_dir, ignore_errors=True)
        (tmp / self.install_dir.name).replace(self.install_dir)
        shutil.rmtree(tmp, ignore_errors=True)

    def prepare(self) -> None:
        """Write ``elasticsearch.yml`` and the heap options; hand the folder to the ES user."""
        config = self.install_dir / "config"
        for sub in ("data", "logs", "tmp"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        settings = {
            "cluster.name": "threes",
            "node.name": "threes-local",
            "discovery.type": "single-node",
            "network.host": HOST,
            "http.port": str(HTTP_PORT),
            "transport.port": str(TRANSPORT_PORT),
            "path.data": str(self.dir / "data"),
            "path.logs": str(self.dir / "logs"),
            # The minimal distribution ships x-pack-security: turn it off for local use.
            "xpack.security.enabled": "false",
            # A nearly full disk must not turn test indices read-only.
            "cluster.routing.allocation.disk.threshold_enabled": "false",
        }
        (config / "elasticsearch.yml").write_text(
            "# Written by threes.local.elasticsearch on every start.\n"
            + "".join(f"{key}: {value}\n" for key, value in settings.items())
        )
        (config / "jvm.options.d" / "threes.options").write_text("\n".join(HEAP) + "\n")
        if self.os_user:
            user = ensure_system_user(self.os_user)
            make_traversable(self.dir)
            chown_tree(self.dir, user)

    def command(self) -> tuple[list[str], dict[str, str], Path]:
        """Return the command (``bin/elasticsearch``, as ``threes-es`` when root)."""
        java_home = find_java(21, prefer=(TEMURIN_25,), env_vars=("ES_JAVA_HOME", "JAVA_HOME"))
        env = {
            "ES_JAVA_HOME": str(java_home),
            "ES_TMPDIR": str(self.dir / "tmp"),
            "ES_PATH_CONF": str(self.install_dir / "config"),
            "HOME": str(self.dir),
        }
        cmd = as_user(self.os_user, [str(self.install_dir / "bin" / "elasticsearch")])
        return cmd, env, self.dir / "logs"

    def probe(self, endpoints: Endpoints) -> None:
        """Wait (briefly) for cluster health yellow.

        The TCP port is tried first: the client logs every refused connection
        with a stack trace, which would flood the output during startup.
        """
        from elasticsearch import Elasticsearch as Client

        url = urlsplit(endpoints.elasticsearch_url)
        port = url.port or (443 if url.scheme == "https" else 9200)
        if not port_open(port, url.hostname or HOST, timeout=2):
            raise LocalStackError(f"nothing listens on {url.hostname}:{port}")
        with Client(endpoints.elasticsearch_url, request_timeout=5, max_retries=0) as client:
            client.cluster.health(wait_for_status="yellow", timeout="2s")

    def address(self, endpoints: Endpoints) -> str:
        """The HTTP URL."""
        return endpoints.elasticsearch_url
