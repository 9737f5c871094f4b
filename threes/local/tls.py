"""Certificates of the local stack: one CA and a server certificate for 127.0.0.1 / localhost.

The Kafka broker's SASL_SSL listener and PostgreSQL (``ssl = on``) present the
server certificate; clients trust ``ca.pem`` and keep verification on
(librdkafka ``ssl.ca.location``, Java ``ssl.truststore.type=PEM``, libpq
``sslmode=verify-full sslrootcert=...``). Everything lives in ``.threes/tls/``::

    ca.pem        the CA certificate (what clients trust)
    ca.key        the CA's private key (0600; signs the server certificate)
    server.pem    the server certificate (SAN: IP 127.0.0.1, DNS localhost)
    server.key    its private key, unencrypted PKCS#8 (0600)

The files are made once and kept; they are made again when one is missing,
unreadable, or the server certificate expires within :data:`RENEW_BEFORE`.
Keys are RSA 2048 (every client here reads them: OpenSSL, the JDK's PEM
key store of Kafka >= 2.7, libpq).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import ipaddress
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from .common import HOST, Layout, LocalStackError

logger = logging.getLogger(__name__)

SERVER_NAMES: tuple[str, ...] = (HOST, "localhost")
"""Names the server certificate is valid for (IP SAN for addresses, DNS SAN otherwise)."""

CA_DAYS = 3650
SERVER_DAYS = 825
RENEW_BEFORE = dt.timedelta(days=30)

_lock = threading.Lock()


@dataclass(frozen=True)
class Certificates:
    """Paths of the local stack's PEM files.

    Attributes:
        ca: The CA certificate clients trust.
        cert: The server certificate (leaf only; the CA signed it directly).
        key: The server's unencrypted PKCS#8 private key.
    """

    ca: Path
    cert: Path
    key: Path

    def keystore_pem(self) -> str:
        """Return a PEM key store for Kafka (``ssl.keystore.type=PEM``): private key, then the chain."""
        return self.key.read_text() + self.cert.read_text() + self.ca.read_text()


def tls_dir(layout: Layout) -> Path:
    """Return the folder of the stack's certificates (``.threes/tls``)."""
    return layout.home / "tls"


def ensure_certificates(layout: Layout) -> Certificates:
    """Return the stack's CA and server certificate, making them when missing or expiring.

    Safe to call from several threads and processes at once (a lock file
    serialises the writers). An existing CA is reused, so clients that
    already trust ``ca.pem`` keep working when only the server certificate
    is renewed.

    Args:
        layout: The local stack's folders.

    Returns:
        The paths of ``ca.pem``, ``server.pem`` and ``server.key``.

    Raises:
        LocalStackError: If the ``cryptography`` package is missing or a file cannot be written.
    """
    folder = tls_dir(layout)
    certs = Certificates(ca=folder / "ca.pem", cert=folder / "server.pem", key=folder / "server.key")
    with _lock:
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / ".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                if not _valid(certs):
                    _make(folder, certs)
            except OSError as exc:
                raise LocalStackError(f"cannot write the local certificates in {folder}: {exc}") from exc
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    return certs


def _x509():  # the module, imported late (only the local stack needs it)
    try:
        from cryptography import x509
    except ImportError as exc:  # pragma: no cover - a dependency of threes
        raise LocalStackError(
            "the local stack's TLS needs the cryptography package (pip install cryptography)"
        ) from exc
    return x509


def _valid(certs: Certificates) -> bool:
    x509 = _x509()
    try:
        cert = x509.load_pem_x509_certificate(certs.cert.read_bytes())
        x509.load_pem_x509_certificate(certs.ca.read_bytes())
        certs.key.read_bytes()
    except (OSError, ValueError):
        return False
    return cert.not_valid_after_utc - RENEW_BEFORE > dt.datetime.now(dt.UTC)


def _make(folder: Path, certs: Certificates) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    ca_key_path = folder / "ca.key"
    try:
        ca_cert = _x509().load_pem_x509_certificate(certs.ca.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        logger.info("tls: renewing the server certificate in %s (CA kept)", folder)
    except (OSError, ValueError):
        logger.info("tls: making a CA and a server certificate for %s in %s", ", ".join(SERVER_NAMES), folder)
        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ca_cert = make_ca(ca_key, "threes local CA")
        _write(ca_key_path, private_pem(ca_key), 0o600)
        _write(certs.ca, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = issue(ca_cert, ca_key, key, SERVER_NAMES)
    _write(certs.key, private_pem(key), 0o600)
    _write(certs.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def make_ca(key, common_name: str, days: int = CA_DAYS):  # cryptography types
    """Return a self-signed CA certificate for ``key``.

    Args:
        key: The CA's private key (``cryptography`` RSA/EC key).
        common_name: The CA's subject CN.
        days: Validity in days from now.
    """
    from cryptography.hazmat.primitives import hashes

    x509 = _x509()
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def issue(ca_cert, ca_key, key, names: tuple[str, ...] | list[str], days: int = SERVER_DAYS):
    """Return a server certificate for ``key``, valid for ``names``, signed by the CA.

    Args:
        ca_cert: The CA certificate (``cryptography.x509.Certificate``).
        ca_key: The CA's private key.
        key: The server's private key.
        names: Host names and IP addresses (the first is also the subject CN).
        days: Validity in days from now.
    """
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    x509 = _x509()
    alt: list = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def private_pem(key) -> bytes:  # a cryptography private key
    """Return ``key`` as unencrypted PKCS#8 PEM (``BEGIN PRIVATE KEY``)."""
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` atomically with ``mode`` (keys are never readable by others)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
