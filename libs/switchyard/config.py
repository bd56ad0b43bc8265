"""Settings: pydantic-settings classes read from the environment.

Two bases, for two kinds of settings:

- `Settings` (env prefix `SY_`): what a *service process* needs - the fleet-wide
  fields every service shares (NATS, partitions, metrics, logging, `SY_ENV`)
  plus the service's own. Subclass it once per service (`WorkerSettings`,
  `TopologySettings`, ...), and pass it to `run_service`.
- `SectionSettings` (no fields): a *settings group of one component* that lives
  inside a service, under its own prefix (`SY_SIM_`, `SY_LLAMACPP_`,
  `SY_VLLM_`). Subclass it for engines and other pluggable parts, so they do
  not inherit the fleet-wide fields: `SY_SIM_NATS_URL` means nothing and must
  not look like a setting. A component that needs a fleet-wide value gets it
  from its service's `Settings`, not from a copy of the field.

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
    """Base of every service's settings: the fleet-wide fields, env prefix `SY_`."""

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

    def nats_servers(self) -> list[str]:
        """`nats_url` may list several servers of one cluster, comma-separated: the client
        tries them in turn when connecting and reconnecting (and learns the rest of the
        cluster from the first server it reaches)."""
        return [url.strip() for url in self.nats_url.split(",") if url.strip()]

    def nats_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"servers": self.nats_servers()}
        if self.nats_user:
            opts["user"] = self.nats_user
            opts["password"] = self.nats_password.get_secret_value() if self.nats_password else None
            # Per-user inboxes: compose/nats-auth.conf lets a user subscribe only to
            # `_INBOX.<user>.>`, so no service can read the replies meant for another.
            opts["inbox_prefix"] = f"_INBOX.{self.nats_user}"
        return opts


class SectionSettings(BaseSettings):
    """Base of one component's settings group, under its own env prefix (`SY_<PART>_`).

    No fields: a section holds only its component's knobs, never the fleet-wide
    ones of `Settings`. Subclasses must set `model_config = SettingsConfigDict(
    env_prefix="SY_<PART>_")`; a missing prefix would read bare variable names
    (`MODEL`, `SEED`), so it is refused at class creation. Sections have no
    `env`, so the placeholder-secret check of `Settings` does not run on them:
    keep secrets in a service's `Settings`.
    """

    model_config = SettingsConfigDict(
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        prefix = cls.model_config.get("env_prefix") or ""
        if not (prefix.startswith("SY_") and prefix.endswith("_") and prefix != "SY_"):
            raise TypeError(
                f"{cls.__name__}: a SectionSettings needs its own env prefix "
                f"'SY_<PART>_', got {prefix!r}"
            )
