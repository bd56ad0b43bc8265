"""The NATS permission files and ARCHITECTURE.md's service table say what the ownership
table (`switchyard.bus.ownership`) says: who sends and who receives each subject.

Every service user of compose/nats-auth.conf (and so of deploy/k8s/nats/nats-auth.conf,
kept identical by tests/unit/test_deploy_manifests.py) may publish and subscribe exactly
what `ownership.grants` derives for it: a permission missing is a service that fails in
production only (tests run without auth), one extra is a service that may do what it
never does. The files stay hand-written for their comments (why each user has what it
has); this test names the pattern to add or remove.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from switchyard.bus import ownership
from switchyard.bus.ownership import FLOWS, PULLS, READS, SERVICES, Service, grants, overlaps
from switchyard.bus.topology import TopologySettings, build_topology
from switchyard.proto import CHANNELS

ROOT = Path(__file__).resolve().parents[2]
AUTH = ROOT / "compose" / "nats-auth.conf"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
TOPOLOGY = build_topology(TopologySettings())


@dataclass(frozen=True)
class User:
    publish: frozenset[str]
    publish_deny: frozenset[str]
    subscribe: frozenset[str]
    subscribe_deny: frozenset[str]
    allow_responses: bool


def _block(text: str, key: str) -> str:
    """The `{...}` after `key:` in `text` (empty if there is none)."""
    found = re.search(rf"\b{key}\s*:\s*\{{", text)
    if found is None:
        return ""
    depth, start = 0, found.end() - 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i]
    raise AssertionError(f"unbalanced braces after {key}")


def _list(block: str, key: str) -> frozenset[str]:
    found = re.search(rf"\b{key}\s*:\s*\[(.*?)\]", block, re.S)
    return frozenset(re.findall(r'"([^"]*)"', found.group(1))) if found else frozenset()


def users(text: str) -> dict[str, User]:
    """nats-auth.conf's users by the name of their nkey variable (`SY_NATS_NKEY_<USER>`)."""
    text = re.sub(r"#[^\n]*", "", text)  # comments (no pattern of ours holds a `#`)
    starts = list(re.finditer(r"nkey:\s*\$SY_NATS_NKEY_([A-Z0-9_]+)", text))
    out: dict[str, User] = {}
    for here, after in zip(starts, [*starts[1:], None], strict=True):
        body = text[here.end() : after.start() if after else len(text)]
        perms = _block(body, "permissions")
        pub, sub = _block(perms, "publish"), _block(perms, "subscribe")
        out[here.group(1).lower()] = User(
            _list(pub, "allow"), _list(pub, "deny"), _list(sub, "allow"), _list(sub, "deny"),
            re.search(r"\ballow_responses\s*:\s*true\b", perms) is not None,
        )  # fmt: skip
    return out


def _differences(what: str, have: frozenset[str], want: frozenset[str]) -> list[str]:
    return [f"{what} missing {p!r}" for p in sorted(want - have)] + [
        f"{what} extra {p!r}" for p in sorted(have - want)
    ]


def permission_problems(text: str) -> list[str]:
    """How the users of a nats-auth.conf text differ from the ownership table."""
    found = users(text)
    problems = [f"users: {sorted(found)} != admin + {SERVICES}"] * (
        set(found) != {"admin", *SERVICES}
    )
    for service in SERVICES:
        if service not in found:
            continue
        user, want = found[service], grants(service)
        problems += [f"{service}: {p}" for p in _differences("publish", user.publish, want.publish)]
        problems += [
            f"{service}: {p}" for p in _differences("subscribe", user.subscribe, want.subscribe)
        ]
        if user.allow_responses != want.allow_responses:
            problems.append(f"{service}: allow_responses should be {want.allow_responses}")
        # A deny over a grant would silently take the grant back.
        for deny, allowed in (
            (user.publish_deny, want.publish),
            (user.subscribe_deny, want.subscribe),
        ):
            problems += [
                f"{service}: deny {d!r} overlaps grant {g!r}"
                for d in sorted(deny) for g in sorted(allowed) if overlaps(d, g)
            ]  # fmt: skip
    # Operators may do anything but serve the request/reply subjects: only their owners do.
    admin = found.get("admin")
    served = frozenset(f.subject for f in FLOWS if f.replies)
    if admin is not None and (admin.publish, admin.subscribe, admin.subscribe_deny) != (
        frozenset({">"}), frozenset({">"}), served
    ):  # fmt: skip
        problems.append(f"admin: allow > both ways, deny subscribing {sorted(served)} only")
    return problems


def test_every_service_user_has_exactly_its_subjects() -> None:
    assert permission_problems(AUTH.read_text()) == []


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ('"supersede.*",\n', "", "router: publish missing 'supersede.*'"),
        ('"req.sql.*",\n', '"req.sql.*", "req.agent.*",\n', "sqlflow: publish extra 'req.agent.*'"),
        ('allow: ["_INBOX.sqlflow.>", "cancel.*"]', 'allow: ["_INBOX.sqlflow.>"]',
         "sqlflow: subscribe missing 'cancel.*'"),
        ('"$JS.ACK.REQ.router.>",', "", "router: publish missing '$JS.ACK.REQ.router.>'"),
        ('"svc.sql.validate", "_INBOX.validator.>"] }\n                allow_responses: true',
         '"svc.sql.validate", "_INBOX.validator.>"] }',
         "validator: allow_responses should be True"),
    ],
)  # fmt: skip
def test_a_permission_missing_or_extra_is_named(old: str, new: str, problem: str) -> None:
    text = AUTH.read_text()
    assert text.count(old) == 1, f"the file no longer has exactly one {old!r}: update the test"
    assert problem in permission_problems(text.replace(old, new))


def test_the_table_speaks_of_the_topology_and_the_channels() -> None:
    channels = {c.name: c for c in CHANNELS}
    streams = ownership.stored_in(TOPOLOGY)
    for flow in FLOWS:
        assert flow.channel in channels, flow
        address = re.sub(r"[^.]*\{[^}]*\}[^.]*", "*", channels[flow.channel].address)
        address = ownership.INBOX if address == "*" else address.replace("dlq.*", "dlq.>")
        assert overlaps(flow.subject, address), (flow, address)
    assert all(ownership.senders(c) for c in channels), "a channel nobody sends on"
    for consumer in TOPOLOGY.consumers:
        owners = [p for p in PULLS if p.owns(consumer)]
        assert len(owners) == 1, (consumer.durable, owners)
    assert all(r.stream in streams for r in READS)


def test_sent_by_and_received_by_come_from_the_code() -> None:
    """The two omissions the hand-written lists had: sqlflow hears cancels, and the
    preprocessor answers (rejected steps and chats) on RES and the reply inbox."""
    assert "sqlflow" in ownership.receivers("cancel", TOPOLOGY)
    assert "preprocessor" in ownership.senders("res")
    assert "preprocessor" in ownership.senders("replyInbox")
    assert ownership.receivers("agentIn", TOPOLOGY) == ("preprocessor",)  # a durable's owner
    assert ownership.receivers("llmEdge", TOPOLOGY) == ()  # a record nothing consumes
    assert set(ownership.receivers("fleetAssignments", TOPOLOGY)) == {"router", "worker"}


@pytest.mark.parametrize(
    ("a", "b", "both"),
    [
        ("res.>", "res.sql.acme", True),
        ("res.*.*", "res.sql", False),
        ("res.>", "res", False),
        ("a.*.c", "a.b.*", True),
        ("a.b", "a.c", False),
        ("_INBOX.>", "_INBOX.edge.>", True),
    ],
)
def test_overlaps(a: str, b: str, both: bool) -> None:
    assert overlaps(a, b) is both and overlaps(b, a) is both


# ----------------------------------------------------------- ARCHITECTURE.md's services

SUBJECT = re.compile(r"^[a-z$_][\w$]*(\.[\w<>*-]+)+$")


def _mentioned(cell: str) -> tuple[set[str], set[str]]:
    """The subjects (`<x>` read as `*`) and the KV buckets a table cell names."""
    buckets = {b.name for b in TOPOLOGY.buckets}
    names = re.findall(r"`([^`]+)`", cell)
    subjects = {re.sub(r"[^.]*<[^>]*>[^.]*", "*", n) for n in names if SUBJECT.match(n)}
    return subjects, {n for n in names if n in buckets}


def _expected(service: Service) -> tuple[set[str], set[str], set[str], set[str]]:
    """What it receives and sends, as subjects and as KV buckets (inboxes, dead letters and
    JetStream's own API are left to nats-auth.conf)."""
    infra = {ownership.INBOX, "dlq.>"}
    received = {f.subject for f in FLOWS if service in f.receivers} - infra
    received |= {
        c.filter_subject
        for p in PULLS
        if p.service == service
        for c in TOPOLOGY.consumers
        if p.owns(c)
    }
    sent = {f.subject for f in FLOWS if service in f.senders} - infra
    written = {s.split(".")[1] for s in sent if s.startswith("$KV.")}
    read = {
        r.stream.removeprefix("KV_")
        for r in READS
        if r.service == service and r.stream.startswith("KV_") and "get" in r.ops
    }
    return received, {s for s in sent if not s.startswith("$KV.")}, read, written


def _unmatched(these: set[str], those: set[str]) -> list[str]:
    return sorted(a for a in these if not any(overlaps(a, b) for b in those))


def test_architecture_service_table_matches_the_ownership_table() -> None:
    rows = re.findall(r"^\| `(\w+)`[^|]*\| ([^|]*) \| ([^|]*) \|", ARCHITECTURE.read_text(), re.M)
    table: dict[str, tuple[str, str]] = {}
    for name, consumes, produces in rows:  # the first table that names it: Services
        table.setdefault(name, (consumes, produces))
    assert set(SERVICES) <= set(table)
    problems = []
    for service in SERVICES:
        (got_in, got_read), (got_out, got_written) = map(_mentioned, table[service])
        want_in, want_out, want_read, want_written = _expected(service)
        for column, want, got in (("consumes", want_in, got_in), ("produces", want_out, got_out)):
            problems += [f"{service} {column}, not said: {s}" for s in _unmatched(want, got)]
            problems += [f"{service} {column}, said but untrue: {s}" for s in _unmatched(got, want)]
        if got_read != want_read or got_written != want_written:
            problems.append(f"{service}: KV read {sorted(got_read)} != {sorted(want_read)}, "
                            f"written {sorted(got_written)} != {sorted(want_written)}")  # fmt: skip
    assert problems == []
