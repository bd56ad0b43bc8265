"""compose/ and deploy/k8s/ agree with the code they run.

- every command a container runs exists (`python -m services.<name>` has a
  `__main__`, `sy ...` is a command of the CLI);
- every `SY_*` variable a service is given is read by its settings class, and the
  placeholder secrets are refused by those classes outside `SY_ENV=local`;
- every Dockerfile, file and extra a manifest names exists;
- each GPU worker is pinned to exactly one GPU, all eight distinct;
- database credentials reach only the executor (and the auditor: a known gap,
  see compose/README.md), the signing key only the validator and executor;
- the NATS users services log in as exist in nats-auth.conf, each container mounts
  its own user's nkey seed and client certificate and nothing else, the Kubernetes
  copy of that file is identical, and the partition count agrees everywhere.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import typer
import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from services.auditor.settings import AuditorSettings
from services.edge.settings import EdgeSettings
from services.executor.settings import ExecutorSettings
from services.preprocessor.settings import PreprocessorSettings
from services.router.settings import RouterSettings
from services.sqlflow.settings import SqlflowSettings
from services.validator.settings import ValidatorSettings
from services.worker.settings import WorkerSettings
from switchyard.bench.agentsim import AGENT_TOKEN_BUDGET
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.cli.app import app
from switchyard.cli.up import runnable
from switchyard.config import Settings, is_secret
from switchyard.engines.llamacpp import LlamaCppSettings
from switchyard.engines.sim import SimSettings
from switchyard.engines.vllm import VllmSettings
from switchyard.natsserver import version as nats_version
from switchyard.probes import PROBES
from switchyard.sqldb.settings import AdminSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
K8S = ROOT / "deploy" / "k8s"
AUTH = COMPOSE_DIR / "nats-auth.conf"

# What each program reads: the service's settings plus the sections it embeds.
WORKER_SETTINGS: tuple[type[BaseSettings], ...] = (
    WorkerSettings, VllmSettings, LlamaCppSettings, SimSettings,
)  # fmt: skip
SETTINGS: dict[str, tuple[type[BaseSettings], ...]] = {
    "services.edge": (EdgeSettings,),
    "services.preprocessor": (PreprocessorSettings,),
    "services.router": (RouterSettings,),
    "services.sqlflow": (SqlflowSettings,),
    "services.validator": (ValidatorSettings,),
    "services.executor": (ExecutorSettings,),
    "services.auditor": (AuditorSettings,),
    "services.worker": WORKER_SETTINGS,
    "sy provision": (TopologySettings,),
    "sy sql": (AdminSettings,),
}
# Variables for third-party code inside our images (Hugging Face in the vLLM worker).
FOREIGN_ENV = {"HF_HOME", "HF_HUB_OFFLINE"}
# What opens the game data: the admin DSN and the secret every tenant account's
# password derives from. The auditor holds only its INSERT-only account's password.
DB_CREDENTIALS = {
    "SY_SQL_DB_SECRET", "SY_SQL_DB_SECRET_FILE", "SY_MYSQL_DSN", "SY_MYSQL_ADMIN_PASSWORD_FILE",
}  # fmt: skip
# Compose secrets (files) and k8s Secrets that hold them.
DB_SECRETS = {"sql-db", "sql-db-secret", "mariadb-root-password"}
DB_HOLDERS = {"executor"}
AUDIT_CREDENTIALS = {"SY_SQL_AUDIT_PASSWORD", "SY_SQL_AUDIT_PASSWORD_FILE"}
AUDIT_HOLDERS = {"auditor"}
DB_ADDRESS = {"SY_MYSQL_HOST", "SY_MYSQL_PORT"}
SIGNING_HOLDERS = {"validator", "executor"}
OPERATOR_JOB = "operator"
# Paths of a service's NATS TLS files and nkey seed: where secrets are, not secrets.
NATS_FILES = {"SY_NATS_CA", "SY_NATS_CERT", "SY_NATS_KEY", "SY_NATS_NKEY_SEED_FILE"}


# --------------------------------------------------------------------------- helpers


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {line!r}"
        env[key.strip()] = value.strip()
    return env


def compose() -> dict[str, Any]:
    doc = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def programs(command: list[str]) -> list[list[str]]:
    """The programs a container command runs (`sh -c "a && b"` is two)."""
    if command[:2] == ["sh", "-c"]:
        return [shlex.split(part) for part in command[2].split("&&")]
    return [command]


def settings_for(argv: list[str]) -> tuple[type[BaseSettings], ...]:
    if argv[0].startswith("python") and argv[1] == "-m":
        return SETTINGS[argv[2]]
    assert argv[0] == "sy", argv
    return SETTINGS["sy provision" if argv[1] == "provision" else f"sy {argv[1]}"]


def cli_has(argv: list[str]) -> bool:
    """Whether `sy <argv...>` names a command of the `sy` app (options ignored)."""
    command: click.Command = typer.main.get_command(app)
    for word in (w for w in argv if not w.startswith("-")):
        if not isinstance(command, click.Group):
            return True  # the rest are arguments
        sub = command.commands.get(word)
        if sub is None:
            return False
        command = sub
    return not isinstance(command, click.Group)


def reads(classes: tuple[type[BaseSettings], ...], var: str) -> bool:
    """Whether one of the settings classes reads environment variable `var`."""
    for cls in classes:
        prefix = str(cls.model_config.get("env_prefix") or "").upper()
        if not var.upper().startswith(prefix):
            continue
        field = var[len(prefix) :].lower().split("__")[0]
        if field in cls.model_fields:
            return True
    return secret_file(classes, var)


def secret_file(classes: tuple[type[BaseSettings], ...], var: str) -> bool:
    """Whether `var` is `SY_<SECRET>_FILE`: a secret field of one of the classes, read from
    a file (`switchyard.config.SecretFileSource`)."""
    for cls in classes:
        prefix = str(cls.model_config.get("env_prefix") or "").upper()
        if var.upper().startswith(prefix) and var.upper().endswith("_FILE"):
            field = cls.model_fields.get(var[len(prefix) : -len("_FILE")].lower())
            if field is not None and is_secret(field.annotation):
                return True
    return False


@dataclass
class Container:
    """One of our containers, from compose or Kubernetes, reduced to what we check."""

    where: str
    name: str
    argv: list[str]
    env: dict[str, str]  # value "<secret>" for values from a Secret
    secret_refs: set[str]  # Secrets (k8s) or compose secrets it reads, as variables or files


def compose_containers() -> Iterator[Container]:
    for name, svc in compose()["services"].items():
        if "build" not in svc:
            continue  # third-party images (nats, mariadb, qdrant, prometheus, grafana)
        env: dict[str, str] = {}
        for f in svc.get("env_file", []):
            env.update(read_env_file(COMPOSE_DIR / f))
        env.update({k: str(v) for k, v in (svc.get("environment") or {}).items()})
        mounted = {s if isinstance(s, str) else s["source"] for s in svc.get("secrets", [])}
        yield Container("compose", name, list(svc["command"]), env, mounted)


def k8s_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((K8S / "base").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
        spec: dict[str, Any] = doc["spec"]["template"]["spec"]
        return spec
    return None


def k8s_containers() -> Iterator[Container]:
    configmaps = {d["metadata"]["name"]: d["data"] for d in k8s_docs() if d["kind"] == "ConfigMap"}
    secrets = {
        d["metadata"]["name"]: d.get("stringData", {}) for d in k8s_docs() if d["kind"] == "Secret"
    }
    for doc in k8s_docs():
        spec = pod_spec(doc)
        if spec is None:
            continue
        for c in spec["containers"]:
            env: dict[str, str] = {}
            refs: set[str] = set()
            for source in c.get("envFrom", []):
                if "configMapRef" in source:
                    env.update(configmaps[source["configMapRef"]["name"]])
                else:
                    name = source["secretRef"]["name"]
                    refs.add(name)
                    env.update({k: "<secret>" for k in secrets[name]})
            for item in c.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add(ref["name"])
                env[item["name"]] = "<secret>" if ref else str(item.get("value", "<field>"))
            mounts = {m["name"] for m in c.get("volumeMounts", [])}
            refs |= {v["secret"]["secretName"] for v in spec.get("volumes", [])
                     if "secret" in v and v["name"] in mounts}  # fmt: skip
            yield Container("k8s", doc["metadata"]["name"], list(c["command"]), env, refs)


def all_containers() -> list[Container]:
    return [*compose_containers(), *k8s_containers()]


def role(c: Container) -> str:
    """The service a container is: `edge`, `worker`, ... or `operator` for jobs."""
    argv = programs(c.argv)[0]
    if argv[0].startswith("python"):
        return argv[2].removeprefix("services.")
    return OPERATOR_JOB


def nats_users() -> set[str]:
    found = re.findall(r"^\s*nkey:\s*\$SY_NATS_NKEY_([A-Z0-9_]+)\s*$", AUTH.read_text(), re.M)
    return {name.lower() for name in found}


def ids(cs: list[Container]) -> list[str]:
    return [f"{c.where}:{c.name}" for c in cs]


CONTAINERS = all_containers()


# --------------------------------------------------------------------------- both


def test_there_is_something_to_check() -> None:
    roles = {role(c) for c in CONTAINERS}
    expected = {"edge", "preprocessor", "router", "worker", "sqlflow", "validator", "executor"}
    assert expected | {"auditor", OPERATOR_JOB} <= roles
    assert {c.where for c in CONTAINERS} == {"compose", "k8s"}


@pytest.mark.parametrize("c", CONTAINERS, ids=ids(CONTAINERS))
def test_every_command_exists(c: Container) -> None:
    for argv in programs(c.argv):
        if argv[0].startswith("python"):
            assert argv[1] == "-m" and runnable(argv[2]), argv
        else:
            assert argv[0] == "sy" and cli_has(argv[1:]), argv


@pytest.mark.parametrize("c", CONTAINERS, ids=ids(CONTAINERS))
def test_every_variable_is_read_by_its_settings(c: Container) -> None:
    classes = tuple(cls for argv in programs(c.argv) for cls in settings_for(argv))
    unread = {
        var for var in c.env if var not in FOREIGN_ENV and not reads(classes, var)
    }  # fmt: skip
    assert unread == set(), f"{c.name}: nothing reads {sorted(unread)}"
    foreign = {v for v in c.env if not v.startswith("SY_")} - FOREIGN_ENV
    assert foreign == set()


@pytest.mark.parametrize("c", CONTAINERS, ids=ids(CONTAINERS))
def test_database_credentials_only_reach_the_executor(c: Container) -> None:
    held = DB_CREDENTIALS & set(c.env)
    if role(c) not in DB_HOLDERS | {OPERATOR_JOB} or c.name == "nats-provision":
        assert held == set(), f"{c.name} ({role(c)}) gets database settings {held}"
        assert not DB_SECRETS & c.secret_refs, c.secret_refs
    if AUDIT_CREDENTIALS & set(c.env) or "sql-audit-password" in c.secret_refs:
        assert role(c) in AUDIT_HOLDERS | {OPERATOR_JOB}, c.name
    if DB_ADDRESS & set(c.env):
        assert role(c) in DB_HOLDERS | AUDIT_HOLDERS | {OPERATOR_JOB}, c.name
    if {"SY_SQL_SIGNING_KEY", "SY_SQL_SIGNING_KEY_FILE"} & set(c.env) or (
        "sql-signing-key" in c.secret_refs
    ):
        assert role(c) in SIGNING_HOLDERS | {OPERATOR_JOB}, c.name


def identity_secrets(c: Container, user: str) -> set[str]:
    """The secrets that hold `user`'s NATS identity where `c` is deployed."""
    if c.where == "compose":
        return {"nats-ca", f"{user}-nkey", f"{user}-cert", f"{user}-key"}
    return {f"nats-{user}"}


@pytest.mark.parametrize("c", CONTAINERS, ids=ids(CONTAINERS))
def test_services_log_in_to_nats_as_their_own_user(c: Container) -> None:
    identity = {"SY_NATS_USER", "SY_NATS_PASSWORD", "SY_NATS_NKEY_SEED_FILE"}
    every = {name for u in nats_users() for name in identity_secrets(c, u)} - {"nats-ca"}
    if c.name == "sql-provision":  # talks to MariaDB only: no NATS identity at all
        assert not identity & set(c.env)
        assert not every & c.secret_refs
        return
    user = c.env.get("SY_NATS_USER")
    assert user in nats_users(), f"{c.name}: NATS user {user!r} is not in {AUTH.name}"
    assert user == ("admin" if role(c) == OPERATOR_JOB else role(c))
    # Its own nkey seed and certificate, mounted as files; no password, nobody else's key.
    assert "SY_NATS_PASSWORD" not in c.env
    assert {"SY_NATS_NKEY_SEED_FILE", "SY_NATS_CA", "SY_NATS_CERT", "SY_NATS_KEY"} <= set(c.env)
    mine = identity_secrets(c, user)
    assert mine <= c.secret_refs, f"{c.name}: mounts {sorted(c.secret_refs)}"
    assert (every & c.secret_refs) == mine - {"nats-ca"}


def test_the_partition_count_agrees_everywhere() -> None:
    mapped = re.findall(r"\{\{partition\((\d+),", AUTH.read_text())
    assert mapped == [str(Settings().partitions)]
    common = read_env_file(COMPOSE_DIR / "env" / "common.env")
    assert common["SY_PARTITIONS"] == mapped[0]
    k8s = next(c for c in k8s_containers() if c.name == "router")
    assert k8s.env["SY_PARTITIONS"] == mapped[0]


def test_kubernetes_loads_the_same_nats_users() -> None:
    assert (K8S / "nats" / "nats-auth.conf").read_bytes() == AUTH.read_bytes()


def test_every_user_has_a_public_nkey_and_an_identity_secret() -> None:
    """The server's public keys (not secrets) and, per user, where its seed lives."""
    users = nats_users()
    assert users == {"admin", "edge", "preprocessor", "router", "worker", "sqlflow",
                     "validator", "executor", "auditor"}  # fmt: skip
    declared = read_env_file(COMPOSE_DIR / "env" / "nats.env")
    assert set(declared) == {f"SY_NATS_NKEY_{u.upper()}" for u in users}
    nkeys = next(d for d in k8s_docs() if d["metadata"]["name"] == "nats-nkeys")
    assert set(nkeys["data"]) == users
    secrets = {d["metadata"]["name"] for d in k8s_docs() if d["kind"] == "Secret"}
    assert {f"nats-{u}" for u in users} <= secrets
    compose_secrets = set(compose()["secrets"])
    assert {f"{u}-{part}" for u in users for part in ("nkey", "cert", "key")} <= compose_secrets


def test_no_shipped_nats_identity_works() -> None:
    """Every public key, seed and certificate in the repository is a placeholder: none
    is an nkey or a PEM, so nothing committed opens (or runs) a NATS server."""
    values = list(read_env_file(COMPOSE_DIR / "env" / "nats.env").values())
    values += list(next(d for d in k8s_docs() if d["metadata"]["name"] == "nats-nkeys")["data"]
                   .values())  # fmt: skip
    for doc in k8s_docs():
        if doc["kind"] == "Secret" and doc["metadata"]["name"].startswith("nats-"):
            values += list(doc["stringData"].values())
    assert values and set(values) == {"changeme"}
    tracked = subprocess.run(
        ["git", "ls-files", "compose/secrets"], cwd=ROOT, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    assert tracked.stdout == ""


# --------------------------------------------------------------------------- compose


def secret_files(c: Container) -> dict[str, str]:
    """`SY_<SECRET>_FILE` variables of a container: a secret setting read from a file (not
    its NATS identity's files, not a file of settings like the edge's key hashes)."""
    classes = tuple(cls for argv in programs(c.argv) for cls in settings_for(argv))
    return {k: v for k, v in c.env.items() if secret_file(classes, k)}


def load_env(
    monkeypatch: pytest.MonkeyPatch, c: Container, tmp_path: Path, content: Callable[[str], str]
) -> None:
    """`c`'s environment as compose gives it, each secret file written under `tmp_path`
    with `content(variable)` in place of the mounted secret."""
    for key in list(os.environ):
        if key.startswith("SY_"):
            monkeypatch.delenv(key)
    for k, v in c.env.items():
        monkeypatch.setenv(k, v)
    for k, v in secret_files(c).items():
        path = tmp_path / c.name / Path(v).name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content(k) + "\n")
        monkeypatch.setenv(k, str(path))


def test_compose_secrets_are_mounted_files_and_placeholders_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No secret is a variable in an env file: each is a file compose mounts from
    compose/secrets/ into the containers that need it; a placeholder written into such a
    file is still refused at start-up, a real value loads."""
    checked = 0
    for c in compose_containers():
        literal = {
            k for k in c.env
            if ("PASSWORD" in k or "SECRET" in k or k.endswith("_KEY"))
            and k not in NATS_FILES and not k.endswith("_FILE")
        }  # fmt: skip
        assert not literal, f"{c.name}: secrets as variables {sorted(literal)}"
        files = secret_files(c)
        if not files:
            continue
        for k, v in files.items():
            assert v.startswith("/run/secrets/"), (c.name, k, v)
            assert Path(v).name in c.secret_refs, f"{c.name}: {v} is not mounted"
        main = settings_for(programs(c.argv)[0])[0]
        load_env(monkeypatch, c, tmp_path, lambda _: "changeme")
        assert c.env["SY_ENV"] == "production"
        with pytest.raises(ValidationError, match=r"(?i)placeholder|real key"):
            main()
        load_env(monkeypatch, c, tmp_path, lambda k: "x" * 40 if "KEY" in k else "s3cret-0123")
        settings = main()
        if isinstance(settings, AdminSettings):  # the operator job: root's password, a file
            assert settings.admin_dsn() == "mysql://root:s3cret-0123@mariadb:3306"
            assert "s3cret" not in settings.shown_dsn()
        checked += 1
    assert checked >= 4  # validator, executor, auditor, sql-provision
    # The third-party images read theirs from files too.
    assert read_env_file(COMPOSE_DIR / "env/mariadb.env")["MARIADB_ROOT_PASSWORD_FILE"]
    assert read_env_file(COMPOSE_DIR / "env/grafana.env")["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    services = compose()["services"]
    assert "mariadb-root-password" in services["mariadb"]["secrets"]
    assert "grafana-admin-password" in services["grafana"]["secrets"]


def test_production_nats_settings_are_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each compose service, as shipped, connects with TLS and its nkey seed file (paths
    to its mounted secrets), and refuses to connect once the seed's path is gone."""
    checked = 0
    for c in compose_containers():
        if "SY_NATS_USER" not in c.env:
            continue
        main = settings_for(programs(c.argv)[0])[0]
        load_env(monkeypatch, c, tmp_path, lambda k: "x" * 40 if "KEY" in k else "s3cret-0123")
        settings = main()
        assert isinstance(settings, Settings)
        with pytest.raises(OSError):  # the TLS files exist only where compose mounts them
            settings.nats_options()
        assert str(settings.nats_nkey_seed_file).startswith("/run/secrets/")
        assert str(settings.nats_ca).startswith("/run/secrets/")
        monkeypatch.delenv("SY_NATS_NKEY_SEED_FILE")
        with pytest.raises(ValueError, match="SY_NATS_NKEY_SEED_FILE"):
            main().nats_options()
        checked += 1
    assert checked >= 9


def test_gpu_workers_own_one_distinct_gpu_each() -> None:
    services = compose()["services"]
    workers = {n: s for n, s in services.items() if n.startswith("worker-gpu")}
    assert len(workers) == 8
    seen: list[str] = []
    for name, svc in workers.items():
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1, name
        assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
        assert len(devices[0]["device_ids"]) == 1, name
        seen += devices[0]["device_ids"]
        assert name == f"worker-gpu{devices[0]['device_ids'][0]}"
        env = read_env_file(COMPOSE_DIR / "env" / "worker.env")
        assert env["SY_ENGINE"] == "vllm"
        assert svc["profiles"] == ["gpu"]
        assert "models:/models" in svc["volumes"]
        assert svc["environment"]["SY_WORKER_ID"] == name.removeprefix("worker-")
        assert svc["build"]["dockerfile"] == "compose/Dockerfile.worker"
    assert sorted(seen) == [str(i) for i in range(8)]


def test_the_agent_gpu_workers_take_the_agent_pools_token_budget() -> None:
    """The 8 x RTX 5090 server's agent engines run the budget `sy agent-sim` measured best
    for that card; the other pools keep vLLM's 8,192 (VllmSettings)."""
    workers = {n: s for n, s in compose()["services"].items() if n.startswith("worker-gpu")}
    budgets = {s["environment"]["SY_POOL"]: s["environment"].get("SY_VLLM_MAX_NUM_BATCHED_TOKENS")
               for s in workers.values()}  # fmt: skip
    assert budgets == {"agent": str(AGENT_TOKEN_BUDGET["rtx5090"]), "sql": None, "llm": None}
    agent = [s for s in workers.values() if s["environment"]["SY_POOL"] == "agent"]
    assert len(agent) == 5
    assert {s["environment"]["SY_VLLM_MAX_NUM_BATCHED_TOKENS"] for s in agent} == {"512"}


def test_cpu_profile_runs_llamacpp_workers_for_every_pool() -> None:
    services = compose()["services"]
    cpu = {n: s for n, s in services.items() if s.get("profiles") == ["cpu"]}
    assert {s["environment"]["SY_POOL"] for s in cpu.values()} == {"agent", "sql", "llm"}
    for svc in cpu.values():
        assert read_env_file(COMPOSE_DIR / "env" / "worker-cpu.env")["SY_ENGINE"] == "llamacpp"
        assert "engine-cpu" in svc["build"]["args"]["EXTRAS"]


def test_images_dockerfiles_and_files_exist() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"])  # fmt: skip
    for name, svc in compose()["services"].items():
        if "build" in svc:
            context = (COMPOSE_DIR / svc["build"]["context"]).resolve()
            assert (context / svc["build"]["dockerfile"]).is_file(), name
            for extra in svc["build"].get("args", {}).get("EXTRAS", "nats").split(","):
                assert extra in extras, f"{name}: no extra {extra!r}"
        else:
            image = svc["image"]
            assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), f"{name}: {source} is missing"
        for f in svc.get("env_file", []):
            assert (COMPOSE_DIR / f).is_file(), f"{name}: {f}"
        assert "healthcheck" in svc or name in ("nats-provision", "sql-provision")


def test_every_service_has_a_health_check() -> None:
    for name, svc in compose()["services"].items():
        check = svc.get("healthcheck", {})
        if svc.get("labels", {}).get("switchyard.job") == OPERATOR_JOB:
            assert check.get("disable") is True
        else:
            assert check.get("test"), f"{name} has no health check"


def test_only_database_services_share_a_network_with_mariadb() -> None:
    services = compose()["services"]
    on_db = {n for n, s in services.items() if "db" in s.get("networks", [])}
    assert on_db == {"mariadb", "executor", "auditor", "sql-provision"}
    assert compose()["networks"]["db"].get("internal") is True
    for name in services:
        if name.startswith("worker-"):
            assert services[name]["networks"] == ["bus"]


# --------------------------------------------------------------------------- kubernetes


def k8s_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in k8s_docs() if d["kind"] == kind]


def test_k8s_images_are_the_ones_compose_builds() -> None:
    built = {s["image"].split(":")[0] for s in compose()["services"].values() if "build" in s}
    for doc in k8s_docs():
        spec = pod_spec(doc)
        for c in spec["containers"] if spec else []:
            assert c["image"] in built, f"{doc['metadata']['name']}: {c['image']}"


def test_k8s_workers_take_one_gpu_each() -> None:
    sets = k8s_kind("StatefulSet")
    assert {s["metadata"]["name"] for s in sets} == {"worker-agent", "worker-sql", "worker-llm"}
    assert sum(s["spec"]["replicas"] for s in sets) == 8
    for sts in sets:
        (c,) = sts["spec"]["template"]["spec"]["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert c["resources"]["requests"]["nvidia.com/gpu"] == 1
        # Model loading is slow: >= 10 minutes before liveness may kill it.
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
        assert {"readinessProbe", "livenessProbe"} <= set(c)


def test_k8s_every_workload_has_probes_and_a_disruption_budget() -> None:
    budgets = {d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
               for d in k8s_kind("PodDisruptionBudget")}  # fmt: skip
    for doc in k8s_kind("Deployment") + k8s_kind("StatefulSet"):
        name = doc["metadata"]["name"]
        assert name in budgets, f"{name} has no PodDisruptionBudget"
        for c in doc["spec"]["template"]["spec"]["containers"]:
            assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(c), name


def test_probes_poll_what_each_service_answers_them_with() -> None:
    """The edge's probes are its own routes; every other service's are `switchyard.probes`'
    paths on its metrics port, never `/metrics`, which answers from before the service is
    connected (a worker: before its engine loaded) to its exit."""
    paths = dict(zip(("startupProbe", "readinessProbe", "livenessProbe"),
                     (f"/{p}" for p in PROBES), strict=True))  # fmt: skip
    for doc in k8s_kind("Deployment") + k8s_kind("StatefulSet"):
        if doc["metadata"]["name"] == "edge":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == "metrics"]
            for probe, path in paths.items():
                assert c[probe]["httpGet"] == {"path": path, "port": port}, (c["name"], probe)
    for name, svc in compose()["services"].items():
        command = svc.get("command", [])
        if command[1:2] == ["-m"] and command[2] != "services.edge":
            test = " ".join(svc["healthcheck"]["test"])
            assert "/readyz' % os.environ['SY_METRICS_PORT']" in test, name


def test_k8s_edge_scales_on_queue_depth() -> None:
    (hpa,) = k8s_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "edge"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "sy_edge_requests_in_flight"
    metrics = (ROOT / "services" / "edge" / "metrics.py").read_text()
    assert '"sy_edge_requests_in_flight"' in metrics


def test_k8s_executor_reaches_only_the_database_and_nats() -> None:
    policies = {d["metadata"]["name"]: d["spec"] for d in k8s_kind("NetworkPolicy")}
    assert policies["default-deny"]["podSelector"] == {}
    assert set(policies["default-deny"]["policyTypes"]) == {"Ingress", "Egress"}
    executor = policies["executor"]
    assert executor["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "executor"}
    peers = [
        (rule["to"][0]["podSelector"]["matchLabels"], sorted(p["port"] for p in rule["ports"]))
        for rule in executor["egress"]
    ]
    assert peers == [
        ({"k8s-app": "kube-dns"}, [53, 53]),
        ({"app.kubernetes.io/name": "nats"}, [4222]),
        ({"app.kubernetes.io/name": "mariadb"}, [3306]),
    ]
    covered = {n for p in policies.values()
               for n in p["podSelector"].get("matchLabels", {}).values()}  # fmt: skip
    for p in policies.values():
        for expr in p["podSelector"].get("matchExpressions", []):
            covered |= set(expr["values"])
    for doc in k8s_kind("Deployment") + k8s_kind("StatefulSet"):
        assert doc["metadata"]["name"] in covered, f"{doc['metadata']['name']}: no NetworkPolicy"


def test_k8s_nats_values_run_a_three_node_jetstream_cluster() -> None:
    values = yaml.safe_load((K8S / "nats-values.yaml").read_text())
    assert values["config"]["cluster"]["enabled"] is True
    assert values["config"]["cluster"]["replicas"] == 3
    assert values["config"]["jetstream"]["enabled"] is True
    assert values["config"]["jetstream"]["merge"]["sync_interval"] == "always"
    assert any("$include" in k for k in values["config"]["merge"])
    assert set(values["container"]["env"]) == {f"SY_NATS_NKEY_{u.upper()}" for u in nats_users()}
    # TLS on the client port (client certificates required) and on the routes.
    assert values["config"]["nats"]["tls"]["enabled"] is True
    assert values["config"]["nats"]["tls"]["merge"]["verify"] is True
    assert values["config"]["cluster"]["tls"]["enabled"] is True
    assert values["config"]["cluster"]["tls"]["merge"]["verify_and_map"] is True
    top = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert top["helmCharts"][0]["valuesFile"] == "nats-values.yaml"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
def test_k8s_base_renders_with_kustomize() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(K8S / "base")], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(out.stdout) if d]
    assert kinds.count("StatefulSet") == 3 and "NetworkPolicy" in kinds


def test_deployed_nats_is_the_version_the_tests_prove() -> None:
    tested = ".".join(map(str, nats_version()))
    assert compose()["services"]["nats"]["image"] == f"nats:{tested}-alpine"
    values = yaml.safe_load((K8S / "nats-values.yaml").read_text())
    assert values["container"]["image"]["tag"] == f"{tested}-alpine"


def test_streams_have_as_many_copies_as_the_cluster_can_hold() -> None:
    """k8s runs a 3-node JetStream cluster and provisions every stream and bucket R3 (any
    node may be lost); compose runs one server, where more than one copy is refused."""
    nodes = yaml.safe_load((K8S / "nats-values.yaml").read_text())["config"]["cluster"]
    job = next(c for c in k8s_containers() if c.name == "nats-provision")
    assert nodes["enabled"] and int(job.env["SY_REPLICAS"]) == nodes["replicas"] == 3
    compose = next(c for c in compose_containers() if c.name == "nats-provision")
    assert compose.env.get("SY_REPLICAS", "1") == "1"
    # A GPU server joining a cluster (docker-compose.cluster.yml over docker-compose.yml).
    over = yaml.safe_load((COMPOSE_DIR / "docker-compose.cluster.yml").read_text())["services"]
    assert over["nats-provision"]["environment"]["SY_REPLICAS"] == "3"
    conf = over["nats"]["command"][-1]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in over["nats"]["volumes"]}
    assert (COMPOSE_DIR / mounted[conf]).is_file() and "include ./nats.conf" in (
        COMPOSE_DIR / mounted[conf]
    ).read_text()
    base = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())["services"]["nats"]
    targets = {v.split(":")[1] for v in base["volumes"] if v.startswith("./")}
    assert {"/etc/nats/nats.conf", "/etc/nats/nats-auth.conf"} <= targets  # nats.conf includes


def test_keda_scales_cpu_services_on_the_lag_of_their_own_consumers() -> None:
    """Every ScaledObject targets a Deployment of base/ whose service reads the durable its
    triggers name, on the stream the topology puts that durable on; NATS' monitoring port
    (where KEDA reads the lag) is the chart's and open to KEDA's namespace."""
    docs = k8s_docs()
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    durables = {(c.stream, c.durable) for c in build_topology(TopologySettings()).consumers}
    reads = {"preprocessor": {"preprocessor-chat", "preprocessor-agent"},
             "sqlflow": {"sqlflow"}, "auditor": {"auditor"}}  # fmt: skip
    monitor = yaml.safe_load((K8S / "nats-values.yaml").read_text())["config"]["monitor"]
    assert {d["metadata"]["name"] for d in scaled} == set(reads)
    for obj in scaled:
        target = obj["spec"]["scaleTargetRef"]["name"]
        assert target in deployments, target
        assert 1 <= obj["spec"]["minReplicaCount"] <= obj["spec"]["maxReplicaCount"]
        named = set()
        for trigger in obj["spec"]["triggers"]:
            meta = trigger["metadata"]
            assert trigger["type"] == "nats-jetstream"
            assert (meta["stream"], meta["consumer"]) in durables, meta
            assert meta["natsServerMonitoringEndpoint"].endswith(f":{monitor['port']}")
            assert meta["account"] == "$G" and "accounts" not in AUTH.read_text()
            assert int(meta["lagThreshold"]) >= 1
            named.add(meta["consumer"])
        assert named == reads[target], (target, named)
    # KEDA owns these replica counts: a second autoscaler on them would fight it.
    hpas = {d["spec"]["scaleTargetRef"]["name"] for d in docs
            if d["kind"] == "HorizontalPodAutoscaler"}  # fmt: skip
    assert not hpas & set(reads), hpas
    assert "keda.yaml" in (K8S / "base" / "kustomization.yaml").read_text()
    policies = (K8S / "base" / "networkpolicies.yaml").read_text()
    assert "kubernetes.io/metadata.name: keda" in policies and monitor["enabled"]
