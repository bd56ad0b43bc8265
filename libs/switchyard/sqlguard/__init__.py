"""The SQL guard: a pure validator for tenant SQL, its policies and its signatures."""

from switchyard.sqlguard.policy import Policy, PolicyStore, load_policy
from switchyard.sqlguard.validator import validate
from switchyard.sqlguard.verdict import Verdict

__all__ = ["Policy", "PolicyStore", "Verdict", "load_policy", "validate"]
