"""The NCCL transport behind a capability check (imported lazily; nothing here runs without CUDA).

Not exercised by the CPU test suite: `benchmarks/nccl_check.py` checks what one GPU allows. NCCL refuses two
ranks on one GPU ("Duplicate GPU detected"), so a sender and a receiver need distinct GPUs.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


def available() -> bool:
    """Whether this process can run NCCL groups: CUDA present and torch built with NCCL."""
    return torch.cuda.is_available() and dist.is_nccl_available()


def require() -> None:
    """Raise unless `available()`.

    Raises:
        RuntimeError: naming what is missing.
    """
    if not available():
        raise RuntimeError(
            "weightSync.backend is 'nccl' but this process has "
            + ("no NCCL support in torch" if torch.cuda.is_available() else "no CUDA device")
        )


def new_group(
    store: dist.Store, rank: int, size: int, timeout: datetime.timedelta, device: torch.device
) -> dist.ProcessGroup:
    """A `ProcessGroupNCCL` on `store`, bound to `device` and connected eagerly (rendezvous now, bounded).

    Args:
        store (dist.Store): the group's PrefixStore.
        rank (int): this rank.
        size (int): group size.
        timeout (datetime.timedelta): bound of every collective.
        device (torch.device): this process's CUDA device.

    Returns:
        dist.ProcessGroup: the NCCL backend object.
    """
    require()
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    pg = dist.ProcessGroupNCCL(store, rank, size, options)
    pg.eager_connect_single_device(device)  # communicator init happens here, within `timeout`
    return pg  # type: ignore[return-value]  # a Backend, used through ProcessGroup's collectives (its stub omits them)
