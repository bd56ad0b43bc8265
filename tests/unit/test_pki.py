"""switchyard.pki: the throwaway CA's certificates chain to it, name the loopback, end soon."""

from __future__ import annotations

import datetime
import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from switchyard.identity import Identity, public_key
from switchyard.pki import CA_DAYS, LEAF_DAYS, LocalCA


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_a_server_certificate_chains_to_the_ca_and_names_the_loopback(tmp_path: Path) -> None:
    ca = LocalCA.ensure(tmp_path)
    files = ca.issue("server", hosts=["nats.example", "10.0.0.7"], server=True)
    cert, root = load(files.cert), load(ca.cert)
    cert.verify_directly_issued_by(root)  # raises unless root's key signed it
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "nats.example"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "10.0.0.7")
    }
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert root.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_expiry_is_short_and_within_the_ca(tmp_path: Path) -> None:
    ca = LocalCA.ensure(tmp_path)
    leaf, root = load(ca.issue("edge", client=True).cert), load(ca.cert)
    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    assert leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc
    assert abs(leaf.not_valid_after_utc - now - datetime.timedelta(days=LEAF_DAYS)) < day
    assert abs(root.not_valid_after_utc - now - datetime.timedelta(days=CA_DAYS)) < day
    assert leaf.not_valid_after_utc <= root.not_valid_after_utc


def test_client_and_route_certificates(tmp_path: Path) -> None:
    ca = LocalCA.ensure(tmp_path)
    client = load(ca.issue("edge", client=True).cert)
    route = load(ca.issue("switchyard-nats-route", server=True, client=True, stem="route").cert)
    assert client.subject.rfc4514_string() == "CN=edge"
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    assert (tmp_path / "route.key").is_file()
    # What nats-server's verify_and_map compares the route user with.
    assert route.subject.rfc4514_string() == "CN=switchyard-nats-route"
    assert set(route.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == {
        ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    }  # fmt: skip


def test_keys_are_private_and_the_ca_is_reused(tmp_path: Path) -> None:
    ca = LocalCA.ensure(tmp_path)
    files = ca.issue("edge", client=True)
    for key in (ca.key, files.key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    first = ca.cert.read_bytes()
    assert LocalCA.ensure(tmp_path).cert.read_bytes() == first
    assert isinstance(load(ca.cert).public_key(), ec.EllipticCurvePublicKey)


def test_an_expiring_ca_is_replaced(tmp_path: Path) -> None:
    """A CA whose end is nearer than a leaf's lifetime is made anew, not reused."""
    ca = LocalCA.ensure(tmp_path)
    key = serialization.load_pem_private_key(ca.key.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "short")])
    short = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    ca.cert.write_bytes(short.public_bytes(serialization.Encoding.PEM))
    renewed = load(LocalCA.ensure(tmp_path).cert)
    assert renewed.not_valid_after_utc - now > datetime.timedelta(days=CA_DAYS - 1)


def test_an_nkey_identity_is_made_once_and_kept_private(tmp_path: Path) -> None:
    first = Identity.ensure(tmp_path, "edge")
    seed = first.seed_file.read_bytes()
    assert seed.startswith(b"SU") and first.public_key.startswith("U")
    assert public_key(seed) == first.public_key
    assert stat.S_IMODE(first.seed_file.stat().st_mode) == 0o600
    assert Identity.ensure(tmp_path, "edge") == first
    assert first.server_env() == {"SY_NATS_NKEY_EDGE": first.public_key}
