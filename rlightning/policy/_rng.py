"""Seeding and capturing the random number generators a training run draws from (python, numpy, torch, CUDA).

States are kept as plain lists, ints and uint8 tensors so a checkpoint loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python's `random`, numpy's global generator, torch and every CUDA device.

    Args:
        seed (int): The seed, >= 0; numpy takes it modulo 2**32.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def capture_rng_state() -> dict[str, Any]:
    """Snapshot every global generator.

    Returns:
        dict[str, Any]: Keys `python`, `numpy`, `torch` and, when CUDA is initialised, `cuda` (one uint8
            tensor per device).
    """
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=True)
    assert isinstance(numpy_state, tuple), "legacy=True gives the MT19937 tuple"
    name, keys, pos, has_gauss, cached = numpy_state
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore generators from `capture_rng_state`'s snapshot.

    Args:
        state (dict[str, Any]): The snapshot; a `cuda` entry is restored only when this process has as many
            CUDA devices.
    """
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
