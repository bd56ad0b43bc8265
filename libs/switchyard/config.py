"""Settings: one pydantic-settings class per service, env prefix `SY_`.

Secrets never have working defaults outside local development: a `SecretStr`
field that still holds a placeholder (or is empty) is refused unless
`SY_ENV=local`, so a forgotten production variable fails at start-up, not later.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDER_SECRETS = frozenset({"", "changeme", "change-me", "secret", "dev", "local", "password"})


class Settings(BaseSettings):
    """Base of every service's settings."""

    model_config = SettingsConfigDict(
        env_prefix="SY_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    env: Literal["local", "test", "staging", "production"] = "local"
    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    metrics_port: int = Field(default=0, ge=0, le=65535, description="0 = no /metrics server")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Partitions per pool; must equal the `{{partition(P, ...)}}` in compose/nats.conf.
    partitions: int = Field(default=64, ge=1, le=4096)
    # Max payload accepted by our decoder; the server's max_payload must be >= this.
    max_message_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)

    service_name: ClassVar[str] = "switchyard"

    @model_validator(mode="after")
    def _refuse_placeholder_secrets(self) -> Settings:
        if self.env == "local":
            return self
        for name, value in self:
            if isinstance(value, SecretStr):
                raw = value.get_secret_value()
                if raw.strip().lower() in PLACEHOLDER_SECRETS:
                    raise ValueError(
                        f"SY_{name.upper()} holds a placeholder secret; "
                        f"set a real one (allowed only with SY_ENV=local)"
                    )
        return self

    def nats_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"servers": [self.nats_url]}
        if self.nats_user:
            opts["user"] = self.nats_user
            opts["password"] = self.nats_password.get_secret_value() if self.nats_password else None
        return opts
