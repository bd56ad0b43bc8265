import ssl
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from switchyard.config import Settings
from switchyard.identity import Identity
from switchyard.pki import LocalCA


class WithSecret(Settings):
    signing_key: SecretStr = SecretStr("changeme")


def test_placeholder_secret_allowed_only_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SY_ENV", "local")
    assert WithSecret().signing_key.get_secret_value() == "changeme"
    monkeypatch.setenv("SY_ENV", "production")
    with pytest.raises(ValidationError, match="placeholder secret"):
        WithSecret()
    monkeypatch.setenv("SY_SIGNING_KEY", "a-real-key-of-some-length")
    assert WithSecret().signing_key.get_secret_value() == "a-real-key-of-some-length"


def test_env_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SY_NATS_URL", "nats://example:4333")
    monkeypatch.setenv("SY_PARTITIONS", "16")
    s = Settings()
    assert s.nats_url == "nats://example:4333"
    assert s.partitions == 16


def test_a_secret_is_read_from_its_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`SY_<FIELD>_FILE` for any SecretStr field: a mounted Docker/Kubernetes secret."""
    (tmp_path / "key").write_text("a-real-key-from-a-file\n")
    monkeypatch.setenv("SY_ENV", "production")
    monkeypatch.setenv("SY_SIGNING_KEY_FILE", str(tmp_path / "key"))
    assert WithSecret().signing_key.get_secret_value() == "a-real-key-from-a-file"
    monkeypatch.setenv("SY_SIGNING_KEY", "another-key-in-the-environment")
    with pytest.raises(ValueError, match="both SY_SIGNING_KEY and SY_SIGNING_KEY_FILE"):
        WithSecret()


def test_production_refuses_nats_without_tls_and_identity(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SY_ENV", "production")
    monkeypatch.setenv("SY_NATS_USER", "edge")
    with pytest.raises(ValueError, match="SY_NATS_CA, SY_NATS_NKEY_SEED_FILE"):
        Settings().nats_options()
    ca = LocalCA.ensure(tmp_path)
    cert = ca.issue("edge", client=True)
    seed = Identity.ensure(tmp_path, "edge").seed_file
    monkeypatch.setenv("SY_NATS_CA", str(ca.cert))
    monkeypatch.setenv("SY_NATS_CERT", str(cert.cert))
    monkeypatch.setenv("SY_NATS_KEY", str(cert.key))
    monkeypatch.setenv("SY_NATS_NKEY_SEED_FILE", str(seed))
    opts = Settings().nats_options()
    assert isinstance(opts["tls"], ssl.SSLContext)
    assert opts["nkeys_seed"] == str(seed)
    assert opts["inbox_prefix"] == "_INBOX.edge"
    assert "password" not in opts


def test_local_runs_need_neither(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SY_ENV", "local")
    assert Settings().nats_options() == {"servers": ["nats://127.0.0.1:4222"]}


def test_a_client_certificate_needs_its_key(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="go together"):
        Settings(nats_ca=tmp_path / "ca.crt", nats_cert=tmp_path / "edge.crt")
