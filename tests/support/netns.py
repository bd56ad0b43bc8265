"""A network namespace joined to this one by a veth pair, to cut a server off the network
(a partition: no reset reaches its peers or clients, unlike a kill) and to heal it."""

from __future__ import annotations

import contextlib
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass


def _ip(*args: str, netns: str | None = None) -> None:
    inside = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*inside, "ip", *args], check=True, capture_output=True, timeout=10)


def available() -> str | None:
    """Why network namespaces cannot be made here, or None if they can."""
    probe = "sy-probe"
    try:
        _ip("netns", "add", probe)
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"cannot create a network namespace ({exc})"
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", probe)
    return None


@dataclass(frozen=True)
class Namespace:
    name: str
    host_ip: str  # this side of the pair
    inner_ip: str  # the namespace's side
    inner_if: str

    def cut(self) -> None:
        """Take the namespace's side of the link down: its traffic goes nowhere."""
        _ip("link", "set", self.inner_if, "down", netns=self.name)

    def heal(self) -> None:
        _ip("link", "set", self.inner_if, "up", netns=self.name)


@contextlib.contextmanager
def namespace(tag: str) -> Iterator[Namespace]:
    """A namespace `sy<tag>` with a /30 link to this one (removed on exit)."""
    k = zlib.crc32(tag.encode()) % 250 + 1
    name, host_if, inner_if = f"sy{tag}"[:15], f"syh{tag}"[:15], f"syn{tag}"[:15]
    ns = Namespace(name, f"10.231.{k}.1", f"10.231.{k}.2", inner_if)
    _ip("netns", "add", name)
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", inner_if)
        _ip("link", "set", inner_if, "netns", name)
        _ip("addr", "add", f"{ns.host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("addr", "add", f"{ns.inner_ip}/30", "dev", inner_if, netns=name)
        _ip("link", "set", inner_if, "up", netns=name)
        _ip("link", "set", "lo", "up", netns=name)
        yield ns
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", host_if)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", name)
