"""How far a KV handoff travels between two GPUs, from where each worker says it sits (#39).

A worker's location (`SY_WORKER_TOPOLOGY`) is a path `host/socket/switch`: its machine,
the CPU socket (NUMA node) its GPU hangs off, and the PCIe switch under that socket, as
`nvidia-smi topo -m` shows them. Two workers' link class is how much of the path they
share, in the names of the seeds' topology ([S0] intro; `nvidia-smi topo -m`'s legend):

- `PIX`: the same PCIe switch (all three parts),
- `NODE`: the same socket, other switches,
- `SYS`: the same machine across sockets (the inter-socket link), or a machine whose
  socket nobody gave (a bare host name, the default),
- `NET`: other machines.

A decode stage goes to the nearest decode worker among those its load allows
(`Affinity.choose(near=...)`); the class is counted per dispatch
(`sy_router_decode_requests_total`), so a deployment sees how far its KV travels. An empty
location (a heartbeat from before #39's topology) is as far as `NET`: it never wins a tie.
"""

from __future__ import annotations

from typing import Literal

LinkClass = Literal["PIX", "NODE", "SYS", "NET"]
# By the number of leading parts two locations share (0: other machines).
_BY_SHARED: tuple[LinkClass, ...] = ("NET", "SYS", "NODE", "PIX")
LINK_CLASSES: tuple[LinkClass, ...] = tuple(reversed(_BY_SHARED))  # nearest first
# A location: one to three parts, each a host name, socket or switch label.
LOCATION_PATTERN = r"^[A-Za-z0-9_.-]{1,64}(/[A-Za-z0-9_.-]{1,64}){0,2}$"


def link_class(a: str, b: str) -> LinkClass:
    """The link a KV handoff between workers at locations `a` and `b` crosses."""
    if not a or not b:
        return "NET"
    shared = 0
    for x, y in zip(a.split("/"), b.split("/"), strict=False):
        if x != y:
            break
        shared += 1
    # Locations of fewer parts share at most what they give: two equal host names are
    # one machine, sockets unknown (SYS); `host/0` twice is one socket (NODE).
    return _BY_SHARED[shared]


def distance(a: str, b: str) -> int:
    """0 for `PIX` up to 3 for `NET`: the order a decode stage prefers its workers in."""
    return LINK_CLASSES.index(link_class(a, b))
