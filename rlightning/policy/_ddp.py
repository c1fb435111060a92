"""Where a policy runs and how trainer ranks share it: the device, the data-parallel world size, DDP wrapping.

DDP wraps each trainable child module on its own, so the policy object keeps its attributes and the weight-sync
names stay those of the children (`agent.fc.weight`; `BasePolicy.clean_state_dict` drops the `module.` DDP adds).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlightning import contract


def resolve_device(setting: str) -> torch.device:
    """Map `spec.policy.device` to a torch device.

    Args:
        setting (str): `auto` (the local CUDA device `LOCAL_RANK` when CUDA is available, else cpu), `cpu` or
            `cuda`.

    Returns:
        torch.device: The device.

    Raises:
        RuntimeError: When `cuda` is asked for and CUDA is not available.
    """
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("spec.policy.device is 'cuda' but this process sees no CUDA device")
    local_rank = contract.TorchrunEnv.from_env(os.environ).local_rank
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def infer_train_dp_world_size() -> int:
    """The data-parallel world size of this trainer process.

    Returns:
        int: `torch.distributed`'s world size when the default group is initialised, else torchrun's
            `WORLD_SIZE` environment variable, else 1.

    Raises:
        ValueError: When `WORLD_SIZE` is set but not a positive integer (or `RANK`, `LOCAL_RANK` malformed:
            `rlightning.contract.TorchrunEnv`).
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return contract.TorchrunEnv.from_env(os.environ).world_size or 1


def mean_over_ranks(value: float) -> float:
    """The mean of a number over the data-parallel ranks, for decisions every rank must take alike.

    Every rank must call it at the same time when the default group has more than one rank.

    Args:
        value (float): This rank's number.

    Returns:
        float: The mean over the ranks; `value` itself without a default group or with one rank.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    total = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total) / dist.get_world_size()


def set_nested_attr(obj: Any, name: str, value: Any) -> None:
    """Set a dotted attribute, `set_nested_attr(policy, "agent.actor", module)`.

    Args:
        obj (Any): The root object.
        name (str): Dotted attribute path; every part but the last must exist.
        value (Any): The new value.

    Raises:
        AttributeError: When an intermediate attribute is missing.
    """
    *parents, last = name.split(".")
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def wrap_children_in_ddp(
    policy: nn.Module, children: list[tuple[str, nn.Module]], device: torch.device, world_size: int
) -> list[tuple[str, nn.Module]]:
    """Replace each trainable child of `policy` by a `DistributedDataParallel` wrapper of it, in place.

    Args:
        policy (nn.Module): The policy whose attributes are replaced.
        children (list[tuple[str, nn.Module]]): The trainable children, by attribute name.
        device (torch.device): The policy's device; a CUDA module is pinned to its own device, a CPU module
            (gloo) takes no `device_ids`.
        world_size (int): The data-parallel world size, for the error message.

    Returns:
        list[tuple[str, nn.Module]]: The wrappers, by the same attribute names.

    Raises:
        RuntimeError: When the default process group is not initialised.
        ValueError: When a trainable parameter lies on `policy` itself, outside every child (DDP could not
            all-reduce its gradient).
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"data-parallel world size is {world_size} but torch.distributed is not initialised; "
            "call torch.distributed.init_process_group first"
        )
    bare = [name for name, param in policy.named_parameters(recurse=False) if param.requires_grad]
    if bare:
        raise ValueError(
            f"{type(policy).__name__}: trainable parameters {bare} are not inside a child module, so DDP "
            "cannot all-reduce their gradients; register them on a child module"
        )
    device_ids = [device.index] if device.type == "cuda" else None
    wrapped: list[tuple[str, nn.Module]] = []
    for name, module in children:
        ddp = nn.parallel.DistributedDataParallel(module, device_ids=device_ids)
        set_nested_attr(policy, name, ddp)
        wrapped.append((name, ddp))
    return wrapped


def unwrap_ddp_children(policy: nn.Module, children: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """Put each `DistributedDataParallel` child of `policy` back as the module it wraps, in place.

    A DDP wrapper's reducer holds the process group: while a wrapper lives, `destroy_process_group` cannot free the
    group, and it is then freed during interpreter teardown, where Gloo's threads can abort the process
    ("terminate called without an active exception") after a run that succeeded.

    Args:
        policy (nn.Module): The policy whose attributes are replaced.
        children (list[tuple[str, nn.Module]]): The trainable children, by attribute name, wrapped or not.

    Returns:
        list[tuple[str, nn.Module]]: The bare modules, by the same attribute names.
    """
    bare: list[tuple[str, nn.Module]] = []
    for name, module in children:
        if isinstance(module, nn.parallel.DistributedDataParallel):
            module = module.module
            set_nested_attr(policy, name, module)
        bare.append((name, module))
    return bare
