"""Scheduling: tenant policies, token-metered admission, fair queues, partition placement.

Pure logic with an injectable clock, so it is tested without servers; the
router service wires it to the bus.
"""
