import pytest
from pydantic import SecretStr, ValidationError

from switchyard.config import Settings


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
