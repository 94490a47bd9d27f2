"""Edge control loops: draft policies (policy.py), link and acceptance estimators, the
adaptive controller, peers' rules, entropy switch and offline policy."""
from edge.control.policy import (DraftPolicy, FixedK, Plan, RoundView, make_policy, policy_names,
                                 register_policy)

__all__ = ["DraftPolicy", "FixedK", "Plan", "RoundView", "make_policy", "policy_names",
           "register_policy"]
