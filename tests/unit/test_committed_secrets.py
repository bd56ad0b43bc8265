"""No secret in the repository is usable outside local development (issue #25).

Every file git tracks is scanned: no private key (PEM) and no NATS nkey seed anywhere;
in the deployment configs (compose env files and YAML, nats-server configs, the k8s
manifests) every secret-looking value is a placeholder the services refuse outside
`SY_ENV=local` (`switchyard.config.PLACEHOLDER_SECRETS`), or a reference to a variable or a
file (`$SY_...`, `${...}`, `*_FILE`) filled in at deployment.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr, ValidationError

from services.edge.app import create_app
from services.edge.auth import KeyRing, PublishedKeyError
from services.edge.errors import ApiError
from services.edge.settings import EdgeSettings
from switchyard.apikeys import PUBLISHED_HASHES, hash_key
from switchyard.config import PLACEHOLDER_SECRETS, Settings

ROOT = Path(__file__).resolve().parents[2]

PEM_PRIVATE = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
# An nkey seed: 'S', the key type (User, Account, Operator, server N, Cluster), 56 base32.
NKEY_SEED = re.compile(r"\bS[UAONC][A-Z2-7]{56}\b")
SECRET_NAME = re.compile(r"(PASSWORD|SECRET|TOKEN|SIGNING_KEY|PRIVATE_KEY|SEED)", re.I)
REFERENCE = re.compile(r"^(\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|/\S+)$")
# Names that look secret but hold none: addresses, account names, file paths, the edge's
# keys file (SHA-256 hashes of API keys, never keys), and limits counted in model tokens
# (SY_VLLM_MAX_NUM_BATCHED_TOKENS).
NOT_SECRET = re.compile(r"(HOST|PORT|USER|_DB|_FILE|NAME|keys\.yaml|MAX_\w*TOKENS)$", re.I)


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def deployment_configs() -> list[Path]:
    kinds = (".env", ".yml", ".yaml", ".conf")
    return [
        p for p in tracked()
        if p.relative_to(ROOT).parts[0] in ("compose", "deploy") and p.name.endswith(kinds)
        and "knowledge" not in p.parts
    ]  # fmt: skip


def harmless(value: str) -> bool:
    """A placeholder the services refuse in production, or a reference filled in later."""
    value = value.strip().strip("'\"")
    return value.lower() in PLACEHOLDER_SECRETS or bool(REFERENCE.match(value))


def test_no_private_key_or_nkey_seed_is_committed() -> None:
    found = []
    for path in tracked():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if PEM_PRIVATE.search(text) or NKEY_SEED.search(text):
            found.append(str(path.relative_to(ROOT)))
    assert not found, f"private keys or nkey seeds committed: {found}"


def env_assignments(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            pairs.append((name.strip(), value.strip()))
    return pairs


def yaml_secrets(node: object, path: str = "") -> list[tuple[str, str]]:
    """(name, value) of every scalar under a secret-looking key, and every value of a k8s
    Secret's data (whose keys are often plain names: `edge: ...`)."""
    pairs: list[tuple[str, str]] = []
    if isinstance(node, dict):
        if node.get("kind") == "Secret":
            for field in ("stringData", "data"):
                for name, value in (node.get(field) or {}).items():
                    if not NOT_SECRET.search(str(name)):
                        pairs.append((f"{path}{name}", str(value)))
        for key, value in node.items():
            if isinstance(value, (dict, list)):
                pairs += yaml_secrets(value, f"{path}{key}.")
            elif isinstance(value, bool) or value is None:
                continue  # `automountServiceAccountToken: false` names a token, holds none
            elif SECRET_NAME.search(str(key)) and not NOT_SECRET.search(str(key)):
                pairs.append((f"{path}{key}", str(value)))
            elif key == "name" and SECRET_NAME.search(str(value)) and "value" in node:
                pairs.append((str(value), str(node["value"])))  # env: [{name:, value:}]
    elif isinstance(node, list):
        for item in node:
            pairs += yaml_secrets(item, path)
    return pairs


def conf_secrets(path: Path) -> list[tuple[str, str]]:
    """`password: ...` (and the like) in a nats-server config."""
    setting = r"^\s*(\w*(?:password|token|seed))\s*[:=]\s*(\S+)"
    return [(name, value) for name, value in re.findall(setting, path.read_text(), re.M | re.I)]


def config_secrets() -> list[tuple[str, str, str]]:
    found = []
    for path in deployment_configs():
        rel = str(path.relative_to(ROOT))
        if path.name.endswith(".env"):
            pairs = [(n, v) for n, v in env_assignments(path) if SECRET_NAME.search(n)]
        elif path.name.endswith(".conf"):
            pairs = conf_secrets(path)
        else:
            pairs = [p for doc in yaml.safe_load_all(path.read_text()) for p in yaml_secrets(doc)]
        found += [(rel, name, value) for name, value in pairs]
    return found


def test_the_scan_reads_the_configs_it_means_to() -> None:
    """Not vacuous: the secrets the deployment needs are found and checked."""
    names = {(rel, name) for rel, name, _ in config_secrets()}
    assert ("compose/env/executor.env", "SY_SQL_DB_SECRET_FILE") in names
    assert ("compose/env/edge.env", "SY_NATS_NKEY_SEED_FILE") in names
    assert ("deploy/k8s/base/secrets.yaml", "nats.nk") in names
    assert ("deploy/k8s/base/secrets.yaml", "tls.key") in names
    assert len(names) >= 30, len(names)


def test_services_authenticate_to_nats_with_nkeys_not_passwords() -> None:
    for conf in ("compose/nats-auth.conf", "deploy/k8s/nats/nats-auth.conf",
                 "compose/nats-cluster.conf", "compose/nats.conf"):  # fmt: skip
        assert conf_secrets(ROOT / conf) == [], conf
    assert "nkey: $SY_NATS_NKEY_EDGE" in (ROOT / "compose/nats-auth.conf").read_text()


def test_every_committed_secret_is_a_placeholder_or_a_reference() -> None:
    usable = [(rel, name, value) for rel, name, value in config_secrets() if not harmless(value)]
    assert not usable, f"usable secrets in committed configs: {usable}"


@pytest.mark.parametrize("value", sorted(PLACEHOLDER_SECRETS))
def test_the_placeholders_are_refused_outside_local(value: str) -> None:
    with pytest.raises(ValidationError, match="placeholder secret"):
        Settings(env="production", nats_user="edge", nats_password=SecretStr(value))
    Settings(env="local", nats_user="edge", nats_password=SecretStr(value))


def committed_key_hashes() -> dict[str, set[str]]:
    """Every API key hash in a committed edge keys file."""
    found = {}
    for path in tracked():
        if path.name.endswith("keys.yaml") and "tests" not in path.relative_to(ROOT).parts:
            keys = (yaml.safe_load(path.read_text()) or {}).get("keys") or {}
            found[str(path.relative_to(ROOT))] = {h.lower() for h in keys}
    return found


def test_the_only_committed_api_keys_are_the_published_local_ones() -> None:
    """A hash is not a key, but a committed hash's key is known to whoever wrote it: only
    the published local development keys (which the docs print) are committed."""
    found = committed_key_hashes()
    assert found["deploy/local/edge-keys.yaml"] == PUBLISHED_HASHES
    assert found["compose/edge-keys.yaml"] == set()
    assert all(hashes <= PUBLISHED_HASHES for hashes in found.values()), found


def test_an_edge_outside_local_development_refuses_the_published_keys(tmp_path: Path) -> None:
    local = ROOT / "deploy" / "local" / "edge-keys.yaml"
    with pytest.raises(PublishedKeyError, match=r"published .*SY_ENV=local"):
        create_app(EdgeSettings(env="production", api_keys_file=local))
    create_app(EdgeSettings(env="local", api_keys_file=local))
    # A key of the operator's own is served in production.
    own = tmp_path / "keys.yaml"
    own.write_text(yaml.safe_dump({"keys": {hash_key("sk-" + "x" * 40): {"tenant": "acme"}}}))
    create_app(EdgeSettings(env="production", api_keys_file=own))
    # And a published key added to a running production edge's file is not picked up.
    ring = KeyRing.load(own, 0.01, published=False)
    own.write_text(local.read_text())
    time.sleep(0.05)
    ring.refresh()
    with pytest.raises(ApiError):
        ring.authenticate("Bearer sk-local-dev")
