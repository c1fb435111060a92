"""Policies: the seed's `BasePolicy` API, the `PolicyGroup` handle, the policy-class loader, PPO, APPO and SAC.

Belongs here: what a policy is and does (build, act, learn, receive weights, checkpoint) and the handle that
keeps evaluators in step with the trainer. `base_policy` holds the seed's API, with its parts mixed in (`_actor`:
rollouts and their accounting; `_weight_mixin`: weight updates; `_checkpoint`: checkpoints); the private modules
behind them each do one job (`_gate`, `_weight_updates`, `_training_state`, `_ddp`, `_timing`, `_rng`); `_experience` is
the layout of experience batches (keys, per-step shapes, dtypes) that collectors write and trainers check;
`_replay` the bounded replay buffer of off-policy learners (SAC); `_vtrace` the V-trace targets of APPO;
`_router` sends rollout requests to the least-loaded of several policy replicas (async rollout mode). Not here:
moving bytes between processes (`rlightning.weights`), env stepping loops and process entrypoints
(`rlightning.runtime`).
"""

from rlightning.policy._ddp import infer_train_dp_world_size, set_nested_attr
from rlightning.policy._env_meta import EnvMeta, make_env
from rlightning.policy._experience import ExperienceField, check_batch, env_fields
from rlightning.policy._loader import build_policy, load_policy_class
from rlightning.policy._rng import seed_everything
from rlightning.policy._router import RolloutRouter
from rlightning.policy._training_state import clone_checkpoint_value
from rlightning.policy.appo import APPOKwargs, APPOPolicy
from rlightning.policy.base_policy import BasePolicy, PolicyRole
from rlightning.policy.policy_group import PolicyGroup
from rlightning.policy.ppo import PPOKwargs, PPOPolicy
from rlightning.policy.sac import SACKwargs, SACPolicy

__all__ = [
    "APPOKwargs",
    "APPOPolicy",
    "BasePolicy",
    "EnvMeta",
    "ExperienceField",
    "PPOKwargs",
    "PPOPolicy",
    "PolicyGroup",
    "PolicyRole",
    "RolloutRouter",
    "SACKwargs",
    "SACPolicy",
    "build_policy",
    "check_batch",
    "clone_checkpoint_value",
    "env_fields",
    "infer_train_dp_world_size",
    "load_policy_class",
    "make_env",
    "seed_everything",
    "set_nested_attr",
]
