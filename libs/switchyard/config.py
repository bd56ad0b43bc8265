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
Every `SecretStr` field `x` may instead be read from a file named by `SY_X_FILE`
(a Docker or Kubernetes secret mounted as a file), so secrets need not sit in the
environment, where `docker inspect`, crash dumps and child processes see them.

NATS: TLS (`SY_NATS_CA`, and `SY_NATS_CERT`/`SY_NATS_KEY` for mutual TLS) and the
service's nkey identity (`SY_NATS_NKEY_SEED_FILE`) are files too; staging and
production refuse to connect without them (deploy/security.md).
"""

from __future__ import annotations

import os
import ssl
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

PLACEHOLDER_SECRETS = frozenset({"", "changeme", "change-me", "secret", "dev", "local", "password"})
# Where a NATS connection must be encrypted and carry a service identity.
SECURED_ENVS = frozenset({"staging", "production"})


def is_secret(annotation: Any) -> bool:
    """`SecretStr`, alone or in a union (`SecretStr | None`)."""
    if annotation is SecretStr:
        return True
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return union and SecretStr in typing.get_args(annotation)


class SecretFileSource(PydanticBaseSettingsSource):
    """`SY_<FIELD>_FILE=<path>` for every `SecretStr` field: the value is that file's
    content (one trailing newline dropped, as `echo > file` and editors leave one)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # Unused: __call__ reads every field at once.
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        prefix = self.settings_cls.model_config.get("env_prefix") or ""
        found: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            if not is_secret(field.annotation):
                continue
            var = f"{prefix}{name}".upper()
            path = os.environ.get(f"{var}_FILE")
            if not path:
                continue
            if os.environ.get(var):
                raise ValueError(f"both {var} and {var}_FILE are set: keep one")
            found[name] = Path(path).read_text().removesuffix("\n")
        return found


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
    # The service's identity in compose/nats-auth.conf: its inbox prefix, and the user
    # name of a password login (local and test servers only).
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    # The service's nkey seed (deploy/security.md); it signs the server's nonce.
    nats_nkey_seed_file: Path | None = None
    # TLS: the CA that signed the server's certificate (TLS on when set), and this
    # client's own certificate and key where the server asks for one (mutual TLS).
    nats_ca: Path | None = None
    nats_cert: Path | None = None
    nats_key: Path | None = None
    # The name to check the server's certificate against, when the URL's host is not
    # one it names (e.g. connecting by an IP address the certificate does not list).
    nats_tls_hostname: str | None = None
    metrics_port: int = Field(default=0, ge=0, le=65535, description="0 = no /metrics server")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Partitions per pool; must equal the `{{partition(P, ...)}}` in compose/nats.conf.
    partitions: int = Field(default=64, ge=1, le=4096)
    # Max payload accepted by our decoder; the server's max_payload must be >= this.
    max_message_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)

    service_name: ClassVar[str] = "switchyard"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        files = SecretFileSource(settings_cls)
        return init_settings, files, env_settings, dotenv_settings, file_secret_settings

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> Settings:
        if (self.nats_cert is None) != (self.nats_key is None):
            raise ValueError("SY_NATS_CERT and SY_NATS_KEY go together (mutual TLS)")
        return self

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

    def nats_tls(self) -> ssl.SSLContext | None:
        """The client TLS context: trusting only `nats_ca` (not the system's CAs: the
        fleet's own CA is the only one that should vouch for its NATS servers)."""
        if self.nats_ca is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.nats_ca))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.nats_cert is not None and self.nats_key is not None:
            context.load_cert_chain(str(self.nats_cert), str(self.nats_key))
        return context

    def nats_options(self) -> dict[str, Any]:
        """nats-py's connect options for this service; refused in staging and production
        without TLS and an nkey identity, so a missing secret stops the service at start-up
        instead of connecting in the clear or as nobody."""
        if self.env in SECURED_ENVS:
            missing = [name for name, value in (
                ("SY_NATS_CA", self.nats_ca), ("SY_NATS_NKEY_SEED_FILE", self.nats_nkey_seed_file),
                ("SY_NATS_USER", self.nats_user),
            ) if not value]  # fmt: skip
            if missing:
                raise ValueError(f"SY_ENV={self.env} needs {', '.join(missing)} to use NATS")
        opts: dict[str, Any] = {"servers": self.nats_servers()}
        tls = self.nats_tls()
        if tls is not None:
            opts["tls"] = tls
            if self.nats_tls_hostname:
                opts["tls_hostname"] = self.nats_tls_hostname
        if self.nats_nkey_seed_file is not None:
            opts["nkeys_seed"] = str(self.nats_nkey_seed_file)
        elif self.nats_user:
            opts["user"] = self.nats_user
            opts["password"] = self.nats_password.get_secret_value() if self.nats_password else None
        if self.nats_user:
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
