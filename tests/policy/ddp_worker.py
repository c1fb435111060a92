"""One DDP rank of `test_ddp_training.py`: PPO on CartPole over a gloo group, one update, results as JSON.

Usage: python ddp_worker.py PORT RANK WORLD_SIZE [POLICY_KWARGS_JSON] OUT_JSON (the store is hosted by the test
process); the policy kwargs default to a small network with 2 epochs of 2 minibatches.
"""

from __future__ import annotations

import datetime
import json
import sys

import torch
import torch.distributed as dist

from rlightning.config import EnvConfig, PolicyConfig, TrainConfig
from rlightning.policy import EnvMeta, PPOPolicy
from rlightning.runtime.collector import RolloutCollector


def main() -> None:
    port, rank, world_size, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[-1]
    default_kwargs = {"hiddenSizes": [16], "updateEpochs": 2, "numMinibatches": 2}
    kwargs = json.loads(sys.argv[4]) if len(sys.argv) > 5 else default_kwargs
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    env = EnvConfig(id="CartPole-v1", num_envs=4)
    config = PolicyConfig(device="cpu", policy_kwargs=kwargs)
    policy = PPOPolicy(config, "train")
    policy.init_train(EnvMeta.from_env_config(env), TrainConfig(total_env_steps=10_000), seed=rank)  # ranks differ
    after_wrap = policy.get_param_digests()  # DDP broadcast rank 0's weights when wrapping
    collector = RolloutCollector(env, policy, seed=100 + rank)  # each rank collects its own envs
    batch = collector.collect(32)
    policy.update_dataset(batch)
    metrics = policy.train()
    result = {
        "ddp": isinstance(policy.agent, torch.nn.parallel.DistributedDataParallel),
        "world_size": policy.dp_world_size,
        "after_wrap": after_wrap,
        "after_update": policy.get_param_digests(),
        "observation_sum": float(batch["observation"].sum()),
        "observation_mean": batch["observation"].reshape(-1, 4).double().mean(0).tolist(),
        "env_steps": policy.env_steps,
        "obs_norm_mean": None if policy.network.obs_norm is None else policy.network.obs_norm.mean.tolist(),
        "metrics": metrics,
    }
    with open(out, "w") as file:
        json.dump(result, file)
    policy.close()  # releases DDP's hold on the group, as the trainer does
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
