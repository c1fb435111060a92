"""One trainer rank of `test_resume.py`: init_train (DDP), then `_resume.resume` from this rank's own run dir.

Usage: python resume_worker.py PORT RANK WORLD_SIZE RUN_DIR OUT_JSON (the store is hosted by the test process).
Writes the rank's state after the resume as JSON: weight digest, optimizer-state sum, counters, version, and what
a trainer's records export at the start of the attempt, before any publish (`Recorder.begin`).
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rlightning.config import EnvConfig, PolicyConfig, TrainConfig
from rlightning.policy import EnvMeta, PPOPolicy
from rlightning.runtime import _records, _resume
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.settings import ProcessSettings

ENV = EnvConfig(id="CartPole-v1", num_envs=2)
CONFIG = PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [16]})


def optimizer_sum(policy: PPOPolicy) -> float:
    """Sum of every tensor in the optimizer state (0.0 for a fresh optimizer)."""
    return sum(
        float(value.double().sum())
        for state in policy.optimizer.state.values()
        for value in state.values()
        if torch.is_tensor(value)
    )


def main() -> None:
    port, rank, world_size, run_dir, out = (
        int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
    )  # fmt: skip
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    policy = PPOPolicy(CONFIG, "train")
    policy.init_train(EnvMeta.from_env_config(ENV), TrainConfig(), seed=100 + rank)
    resumed = _resume.resume(policy, RunDir(run_dir), enabled=True)
    settings = ProcessSettings(group_name="g", namespace=None, spec_path=run_dir / "spec.yaml", run_dir=run_dir,
                               master_addr="127.0.0.1", weight_sync_port=0, metrics_port=0, report_status=False,
                               attempt=1)
    recorder = _records.Recorder(settings, RunDir(run_dir))
    recorder.begin(policy.iteration, policy.env_steps, policy.weight_version)
    exported = {name: recorder.metrics.registry.get_sample_value(name)
                for name in ("rlightning_weight_version", "rlightning_train_iteration", "rlightning_train_env_steps")}
    result = {
        "resumed_from": resumed,
        "digest": _resume.state_digest(policy),
        "optimizer_sum": optimizer_sum(policy),
        "iteration": policy.iteration,
        "env_steps": policy.env_steps,
        "weight_version": policy.weight_version,
        "exported": exported,
    }
    Path(out).write_text(json.dumps(result))
    policy.close()  # releases DDP's hold on the group, as the trainer does
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
