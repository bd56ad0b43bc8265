"""A throwaway certificate authority for local TLS: `sy up --secure` and the tests.

It makes what a production deployment gets from its own PKI (cert-manager, Vault, an
operator's CA): a CA, server certificates for nats-server (client port and cluster
routes) and client certificates for the services (mutual TLS). Local use only: the CA
key lies next to its certificate, so anyone who can read the state directory can mint
certificates the CA's servers accept.

EC P-256 keys, because they are generated in milliseconds (an RSA-3072 key takes about
a second, and `sy up --secure` makes a dozen) and every TLS stack in the path (Go's in
nats-server, OpenSSL's in Python) verifies them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Short: these certificates exist for one developer's machine. A CA closer than
# RENEW_BEFORE to its end is replaced (its leaves with it) rather than reused.
CA_DAYS = 90
LEAF_DAYS = 30
RENEW_BEFORE = datetime.timedelta(days=LEAF_DAYS + 1)
# What a local server certificate always names: clients reach it on the loopback.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class CertFiles:
    """A PEM certificate and its PEM private key (mode 0600)."""

    cert: Path
    key: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Created 0600, never world-readable for an instant (a later chmod would leave a window).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Signatures only (ECDSA keys neither encipher nor agree keys in TLS 1.2+/1.3); a CA
    also signs certificates and revocation lists."""
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


@dataclass(frozen=True)
class LocalCA:
    """A CA whose files live in `directory` (`ca.crt`, `ca.key`) with the leaves it issued."""

    directory: Path

    @property
    def cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def key(self) -> Path:
        return self.directory / "ca.key"

    @classmethod
    def ensure(cls, directory: Path, name: str = "Switchyard local CA") -> LocalCA:
        """The CA in `directory`, made if missing or about to expire. Reused otherwise, so
        a client that was given `ca.crt` once keeps trusting the fleet across restarts."""
        ca = cls(directory)
        if ca.cert.is_file() and ca.key.is_file():
            current = x509.load_pem_x509_certificate(ca.cert.read_bytes())
            if current.not_valid_after_utc - _now() > RENEW_BEFORE:
                return ca
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))  # clock skew
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(signs_certificates=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        _write_key(ca.key, key)
        ca.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return ca

    def issue(
        self, name: str, *, hosts: Iterable[str] = (), server: bool = False,
        client: bool = False, stem: str | None = None,
    ) -> CertFiles:  # fmt: skip
        """A leaf certificate `<stem>.crt`/`<stem>.key` (stem: `name` by default) signed by
        this CA, its common name `name`. `server`: usable by a TLS server, naming LOCAL_HOSTS
        and `hosts`; `client`: usable as a client certificate (mutual TLS). A route
        certificate is both: a cluster member accepts routes and dials them."""
        if not (server or client):
            raise ValueError("a certificate must be usable by a server, a client or both")
        ca_key = serialization.load_pem_private_key(self.key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{self.key}: not an EC key of this module")
        ca_cert = x509.load_pem_x509_certificate(self.cert.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        end = min(now + datetime.timedelta(days=LEAF_DAYS), ca_cert.not_valid_after_utc)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(signs_certificates=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if server:
            names = list(dict.fromkeys([*LOCAL_HOSTS, *hosts]))  # ordered, no duplicates
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(h) for h in names]), critical=False
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        stem = stem or name
        files = CertFiles(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        _write_key(files.key, key)
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return files
