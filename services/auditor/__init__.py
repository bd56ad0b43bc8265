"""Auditor: writes audit events to the append-only audit table."""
