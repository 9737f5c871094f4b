"""An S3-compatible server: s3proxy 4.1.0 on 127.0.0.1:18090, filesystem-backed.

Objects live under ``.threes/s3/data``; clients authenticate with AWS
signature v2 or v4 (identity ``threes``, credential ``threes-secret-key``) and
must use path-style addressing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from .common import HOST
from .kafka import JAVA_17
from .maven import copy_artifact
from .service import Service
from .system import find_java

if TYPE_CHECKING:
    from .endpoints import Endpoints

logger = logging.getLogger(__name__)

S3PROXY_VERSION = "4.1.0"
S3PROXY_ARTIFACT = f"org.gaul:s3proxy:{S3PROXY_VERSION}:jar:jar-with-dependencies"
S3_PORT = 18090
ACCESS_KEY_ID = "threes"
SECRET_ACCESS_KEY = "threes-secret-key"
REGION = "us-east-1"


class S3(Service):
    """s3proxy with the jclouds filesystem provider."""

    name = "s3"
    title = "S3 (s3proxy)"
    env_var = "THREES_S3_ENDPOINT_URL"
    endpoint_vars: ClassVar[dict[str, str]] = {
        "s3_endpoint_url": "THREES_S3_ENDPOINT_URL",
        "s3_access_key_id": "THREES_S3_ACCESS_KEY_ID",
        "s3_secret_access_key": "THREES_S3_SECRET_ACCESS_KEY",
        "s3_region": "THREES_S3_REGION",
    }
    ports = (S3_PORT,)
    health_timeout = 60.0
    stop_timeout = 15.0

    @property
    def jar(self) -> Path:
        """The self-contained s3proxy jar."""
        return self.dir / f"s3proxy-{S3PROXY_VERSION}-jar-with-dependencies.jar"

    @property
    def conf(self) -> Path:
        """s3proxy's properties file."""
        return self.dir / "s3proxy.conf"

    def install(self) -> None:
        """Download the jar with Maven (skipped when present)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        copy_artifact(self.layout, S3PROXY_ARTIFACT, self.jar, log_name="s3")

    def prepare(self) -> None:
        """Write ``s3proxy.conf`` and create the storage folder."""
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        settings = {
            "s3proxy.endpoint": f"http://{HOST}:{S3_PORT}",
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": ACCESS_KEY_ID,
            "s3proxy.credential": SECRET_ACCESS_KEY,
            "jclouds.provider": "filesystem",
            "jclouds.filesystem.basedir": str(data),
        }
        self.conf.write_text(
            "# Written by threes.local.s3 on every start.\n"
            + "".join(f"{key}={value}\n" for key, value in settings.items())
        )

    def command(self) -> tuple[list[str], dict[str, str], Path]:
        """Return ``java -jar s3proxy.jar --properties s3proxy.conf``."""
        java = find_java(17, prefer=(JAVA_17,)) / "bin" / "java"
        cmd = [
            str(java),
            "-Xmx256m",
            "-XX:+ExitOnOutOfMemoryError",
            "-jar",
            str(self.jar),
            "--properties",
            str(self.conf),
        ]
        return cmd, {}, self.dir

    def probe(self, endpoints: Endpoints) -> None:
        """List buckets with boto3."""
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "s3",
            endpoint_url=endpoints.s3_endpoint_url,
            aws_access_key_id=endpoints.s3_access_key_id,
            aws_secret_access_key=endpoints.s3_secret_access_key,
            region_name=endpoints.s3_region,
            config=Config(
                s3={"addressing_style": "path"}, connect_timeout=3, read_timeout=5, retries={"max_attempts": 1}
            ),
        )
        client.list_buckets()

    def address(self, endpoints: Endpoints) -> str:
        """The endpoint URL."""
        return endpoints.s3_endpoint_url
