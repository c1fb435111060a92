"""APPO: PPO's clipped surrogate on batches acted with older weights, with V-trace targets.

Algorithm: the value targets and advantages are V-trace's (Espeholt et al. 2018, "IMPALA", arXiv:1802.01561, eq. 1
and section 4.2; `_vtrace.vtrace`), computed once per update, before the epochs, with the log-probabilities of the
weights the update starts from against the behaviour log-probabilities each batch carries (`log_prob`, recorded
when the action was taken); the surrogate is PPO's, clipped, over `pi/mu` with those same behaviour
log-probabilities, as asynchronous PPO in Sample Factory (Petrenko et al. 2020, arXiv:2006.11751).
The advantages are not weighted by the clipped importance weight as IMPALA's actor-critic loss does: the surrogate's
ratio already weighs each sample by `pi/mu`. Everything else (networks, normalisation, minibatches, learning-rate
and clip annealing, target KL) is `PPOPolicy`'s; on-policy data (lag 0) gives `rho = 1`, the targets are the
GAE(`gaeLambda`) returns and, with `gaeLambda` 1 (the default, IMPALA's), the advantages GAE's: APPO then trains as
PPO does with GAE(1).

A subclass rather than a `correction: vtrace` option of PPO: whether a policy corrects for lag is a fact of its
class that the runtime reads (`corrects_policy_lag`: evaluators free-run, `rlightning.runtime.eval.BatchPacing`),
the manifest names it where it names the algorithm (`policyClass`), as RLlib's APPO and Sample Factory's do, and
`PPOPolicy` keeps one way to estimate advantages (`estimate_advantages`, overridden here).

`train()` adds the importance weights' statistics to PPO's: `importance_weight_mean` (the mean of `pi/mu` over the
batch) and `importance_weight_clipped_share` (the share above `rhoBar`). docs/vtrace.md has the equations, the lag
and drop rules and how to choose `train.maxPolicyLag`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field, model_validator
from tensordict import TensorDict

from rlightning.config import PolicyConfig
from rlightning.policy import _vtrace, base_policy
from rlightning.policy.ppo import PPOKwargs, PPOPolicy


class APPOKwargs(PPOKwargs):
    """`spec.policy.policyKwargs` of `APPOPolicy`: PPO's (camelCase, unknown keys are errors), with V-trace's
    truncation levels; `gaeLambda` is V-trace's lambda.
    """

    gae_lambda: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="V-trace's lambda: traces c_t = lambda * min(cBar, rho_t); on-policy the targets are the "
        "GAE(lambda) returns. 1.0 as IMPALA.",
    )
    rho_bar: float = Field(
        default=1.0, gt=0, description="Truncation of the importance weights in V-trace's TD errors (IMPALA's rho-bar)."
    )
    c_bar: float = Field(
        default=1.0, gt=0, description="Truncation of the importance weights in V-trace's traces (IMPALA's c-bar)."
    )

    @model_validator(mode="after")
    def _rho_bar_at_least_c_bar(self) -> APPOKwargs:
        if self.rho_bar < self.c_bar:
            raise ValueError(f"rhoBar: must be >= cBar ({self.c_bar}), as IMPALA assumes, got {self.rho_bar}")
        return self


class APPOPolicy(PPOPolicy):
    """Asynchronous PPO: trains on fleet batches up to `train.maxPolicyLag` versions old, correcting with V-trace
    (see the module docstring for the algorithm; the batch layout is `PPOPolicy`'s).

    Args:
        config (PolicyConfig): `spec.policy`; `policy_kwargs` is validated by `APPOKwargs`.
        role_type (PolicyRole | str): `train` or `eval`.

    Raises:
        pydantic.ValidationError: When `policy_kwargs` is invalid (a ValueError), e.g. `rhoBar` below `cBar`.

    Examples:
        >>> policy = APPOPolicy(PolicyConfig(policy_kwargs={"rhoBar": 1.0, "cBar": 1.0}), "train")
        >>> policy.corrects_policy_lag
        True
    """

    kwargs_model: ClassVar[type[PPOKwargs]] = APPOKwargs
    algorithm: ClassVar[str] = "APPO"
    corrects_policy_lag: ClassVar[bool] = True
    kwargs: APPOKwargs

    def __init__(self, config: PolicyConfig, role_type: base_policy.PolicyRole | str) -> None:
        super().__init__(config, role_type)
        self._importance: dict[str, float] = {}  # the statistics of the latest estimate_advantages

    def estimate_advantages(self, data: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """V-trace advantages and value targets of a batch (`_vtrace.vtrace`), with the log-probabilities of the
        weights this update starts from; keeps the importance weights' statistics for `train`'s result.

        Args:
            data (TensorDict): `[T, N]`, the batch as `PPOPolicy.estimate_advantages` takes it (`reward`, `value`,
                `next_value`, `normalized_observation` `[T, N, D]`, `action`, behaviour `log_prob`, `terminated`,
                `truncated`).

        Returns:
            tuple[torch.Tensor, torch.Tensor]: advantages (`r_t + gamma * v_{t+1} - V(x_t)`) and value targets
                (`v_t`), `[T, N]` float32.
        """
        kw = self.kwargs
        steps, envs = data.batch_size
        action = data["action"]
        _, target_log_prob, _, _ = self.network(
            data["normalized_observation"].reshape(steps * envs, -1),
            action.reshape(steps * envs, *action.shape[2:]),
            normalized=True,
        )
        out = _vtrace.vtrace(
            data, target_log_prob.reshape(steps, envs), kw.gamma, rho_bar=kw.rho_bar, c_bar=kw.c_bar,
            lambda_=kw.gae_lambda,
        )  # fmt: skip
        self._importance = {
            _vtrace.IMPORTANCE_WEIGHT_MEAN: float(out.rhos.mean()),
            _vtrace.IMPORTANCE_WEIGHT_CLIPPED_SHARE: float((out.rhos > kw.rho_bar).float().mean()),
        }
        return out.advantages, out.vs

    def train(self) -> dict[str, float]:  # type: ignore[override]  # the seed's train() takes no arguments
        """One PPO update with V-trace targets (`PPOPolicy.train`).

        Returns:
            dict[str, float]: `PPOPolicy.train`'s statistics, and `importance_weight_mean` (mean of `pi/mu` over the
                batch, `pi` the weights the update starts from) and `importance_weight_clipped_share` (the share
                of those weights above `rhoBar`, 0..1).

        Raises:
            RuntimeError: Without `init_train` or without a dataset.
        """
        metrics = super().train()
        metrics.update(self._importance)
        return metrics
