"""Run under torchrun (gloo DDP): rank 0 hosts a WeightSender next to the DDP default group and publishes.

Usage: torchrun --nproc-per-node N wsync_torchrun_sender.py WSYNC_PORT RESULT_JSON
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

torch.set_num_threads(1)

from wsync_helpers import BUCKET_BYTES, Net, wait_members, wait_reports, weights_for  # noqa: E402

from rlightning.config import WeightSyncConfig  # noqa: E402
from rlightning.weights import WeightSender, load_named_state, named_state  # noqa: E402


def main() -> None:
    port, result_path = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")  # the DDP default group, on torchrun's agent store
    rank = dist.get_rank()
    net = Net()
    load_named_state(net, weights_for(1))
    ddp = nn.parallel.DistributedDataParallel(net)
    result: dict = {"agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"), "world_size": dist.get_world_size()}
    if rank == 0:
        config = WeightSyncConfig(backend="gloo", bucket_size_bytes=BUCKET_BYTES, group_size=2, timeout_seconds=5)
        sender = WeightSender(config, "127.0.0.1", port)
        wait_members(sender, {0})
        stats = sender.publish(named_state(ddp))
        reports = wait_reports(sender, lambda r: 0 in r and r[0].applied.version == 1)
        result.update(acked=stats.receivers_acked, report_digest=reports[0].applied.digest if 0 in reports else None)
        sender.close()
    total = torch.ones(1)
    dist.all_reduce(total)  # the default group still works after the weight-sync group
    result["all_reduce"] = total.item()
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(0.1)


if __name__ == "__main__":
    main()
