"""The message bus: NATS connection, JetStream topology and provisioning, publishing,
pull-consumer loops, request/reply services and token streams."""

from switchyard.bus.connection import Bus, connect
from switchyard.bus.publish import publish, trace_headers

__all__ = ["Bus", "connect", "publish", "trace_headers"]
