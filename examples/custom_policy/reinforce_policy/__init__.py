"""An example of a user's own rlightning policy package: `reinforce_policy.policy:ReinforcePolicy`."""

from reinforce_policy.policy import ReinforceKwargs, ReinforcePolicy

__all__ = ["ReinforceKwargs", "ReinforcePolicy"]
