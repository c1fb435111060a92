"""One DDP rank of `test_sac.py`'s two-rank test: SAC on Pendulum over a gloo group, two updates, results as JSON.

Usage: python sac_ddp_worker.py PORT RANK WORLD_SIZE OUT_JSON (the store is hosted by the test process).
"""

from __future__ import annotations

import datetime
import json
import sys

import torch
import torch.distributed as dist

from rlightning.config import EnvConfig, PolicyConfig, TrainConfig
from rlightning.policy import EnvMeta, SACPolicy
from rlightning.runtime.collector import RolloutCollector


def main() -> None:
    port, rank, world_size, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    env = EnvConfig(id="Pendulum-v1", num_envs=2)
    config = PolicyConfig(
        device="cpu",
        policy_kwargs={"hiddenSizes": [16, 16], "batchSize": 16, "learningStarts": 32, "gradientSteps": 3},
        optim={"annealLr": False},
    )
    policy = SACPolicy(config, "train")
    policy.init_train(EnvMeta.from_env_config(env), TrainConfig(total_env_steps=10_000), seed=rank)  # ranks differ
    after_wrap = policy.get_param_digests()  # DDP broadcast rank 0's weights, the target copied the critic
    collector = RolloutCollector(env, policy, seed=100 + rank)  # each rank collects its own envs
    observation_sum = 0.0
    metrics = {}
    for _ in range(2):
        batch = collector.collect(16)
        observation_sum += float(batch["observation"].sum())
        policy.update_dataset(batch)
        metrics = policy.train()
    result = {
        "ddp": [isinstance(getattr(policy, name), torch.nn.parallel.DistributedDataParallel)
                for name in ("actor", "critic", "temperature")],
        "target_wrapped": isinstance(policy.critic_target, torch.nn.parallel.DistributedDataParallel),
        "after_wrap": after_wrap,
        "after_update": policy.get_param_digests(),
        "eval_weights": sorted(policy.get_eval_weights()),
        "observation_sum": observation_sum,
        "env_steps": policy.env_steps,
        "metrics": metrics,
    }  # fmt: skip
    with open(out, "w") as file:
        json.dump(result, file)
    policy.close()  # releases DDP's hold on the group, as the trainer does
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
