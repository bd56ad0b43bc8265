"""The edge's HTTP API, one `APIRouter` per surface; `services.edge.app` assembles them."""
