"""Start a Switchyard fleet, wait until it is really ready, always stop it.

One launcher for `sy up`, every benchmark and every test fixture:

- `spec`: what a fleet is (`FleetSpec`, `Pool`, `Edge`) and its expansion into the
  services to start (`Roster` of `Service`);
- `bus`: the NATS it runs on (`nats_server`) and the topology (`provision`);
- `processes`: services as child processes (`ProcessGroup`), logged, stopped with
  SIGTERM then SIGKILL;
- `inproc`: services as tasks on the caller's event loop (`InprocGroup`, `running`);
- `readiness`: waits on what the services publish (heartbeats, partition assignments,
  `/readyz`, a consumer's pull), never on sleeps;
- `launch`: all of it in order, as a context manager (`launch`, `Fleet`).

    spec = FleetSpec(pools=(Pool("llm", workers=2),), engine="sim", edge=Edge(keys={"sk-x": "t"}))
    async with launch(spec, mode="inproc", nats_url=url) as fleet:
        ...  # every partition is bound by a live worker, the edge answers /readyz

A tool package: it imports the services; the core library and the services never
import it.
"""

from switchyard.fleet.bus import nats_server, provision
from switchyard.fleet.errors import FleetError, NotReady, ServiceExited
from switchyard.fleet.launch import Fleet, launch
from switchyard.fleet.processes import ProcessGroup, Stopped
from switchyard.fleet.readiness import PoolReady, PoolState
from switchyard.fleet.spec import UNMETERED, Edge, FleetSpec, Pool, Roster, Service, env_of

__all__ = [
    "UNMETERED",
    "Edge",
    "Fleet",
    "FleetError",
    "FleetSpec",
    "NotReady",
    "Pool",
    "PoolReady",
    "PoolState",
    "ProcessGroup",
    "Roster",
    "Service",
    "ServiceExited",
    "Stopped",
    "env_of",
    "launch",
    "nats_server",
    "provision",
]
