"""A bounded replay buffer of transitions: a circular TensorDict storage with uniform sampling.

TorchRL's `ReplayBuffer` with a `LazyTensorStorage` does this job, but torchrl is not a dependency of rlightning;
this is the small part an off-policy policy needs. Memory is fixed at `capacity` transitions, allocated on the
first `extend` from that batch's keys, per-transition shapes and dtypes; the oldest transitions are overwritten.
`state_dict` holds the transitions held, oldest first (what a checkpoint needs to resume with the buffer).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict


class CircularReplayBuffer:
    """Holds the newest `capacity` transitions and samples them uniformly with replacement.

    Args:
        capacity (int): Transitions kept (>= 1); memory is `capacity` times the bytes of one transition.
        device (torch.device | str, optional): Where the storage lives. Defaults to "cpu".

    Raises:
        ValueError: When `capacity` < 1.

    Examples:
        >>> buffer = CircularReplayBuffer(4)
        >>> buffer.extend(TensorDict({"reward": torch.arange(6.0)}, batch_size=[6]))
        >>> len(buffer), buffer.sample(3)["reward"].shape
        (4, torch.Size([3]))
    """

    def __init__(self, capacity: int, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ValueError(f"replay buffer capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.device = torch.device(device)
        self._storage: TensorDict | None = None
        self._cursor = 0  # next slot written
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def extend(self, transitions: TensorDict) -> None:
        """Append transitions `[B]`, overwriting the oldest once full (only the last `capacity` of a larger B).

        Args:
            transitions (TensorDict): `[B]` transitions; every call must have the keys, per-transition shapes
                and dtypes of the first.

        Raises:
            ValueError: When `transitions` is not 1-D, or its layout differs from the storage's.
        """
        if transitions.batch_dims != 1:
            raise ValueError(f"replay buffer takes [B] transitions, got batch_size {list(transitions.batch_size)}")
        transitions = transitions[-self.capacity :].to(self.device)
        if self._storage is None:
            self._storage = TensorDict(
                {
                    key: torch.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype, device=self.device)
                    for key, value in transitions.items()
                },
                batch_size=[self.capacity],
                device=self.device,
            )
        elif set(transitions.keys()) != set(self._storage.keys()):
            raise ValueError(
                f"replay buffer holds keys {sorted(self._storage.keys())}, got {sorted(transitions.keys())}"
            )
        count = transitions.shape[0]
        index = (torch.arange(count, device=self.device) + self._cursor) % self.capacity
        try:
            self._storage[index] = transitions
        except RuntimeError as error:  # a shape or dtype that does not fit the storage
            raise ValueError(f"replay buffer: transitions do not fit the storage: {error}") from error
        self._cursor = (self._cursor + count) % self.capacity
        self._size = min(self._size + count, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> TensorDict:
        """Draw `batch_size` transitions uniformly, with replacement.

        Args:
            batch_size (int): Transitions drawn (>= 1).
            generator (torch.Generator | None, optional): Source of the indices (on the CPU). Defaults to None
                (torch's global generator).

        Returns:
            TensorDict: `[batch_size]` transitions on `device`, copies of the stored ones.

        Raises:
            RuntimeError: When the buffer is empty.
        """
        if self._storage is None or self._size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        index = torch.randint(self._size, (batch_size,), generator=generator)
        return self._storage[index.to(self.device)]

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """The transitions held, oldest first, for a checkpoint; the unfilled part of the storage is left out.

        Returns:
            dict[str, dict[str, torch.Tensor]]: `{"transitions": {key: [len(self), *F] tensor}}` (copies, on
                `device`), `{"transitions": {}}` when empty. Bytes: `len(self)` times the bytes of one transition.
        """
        if self._storage is None or self._size == 0:
            return {"transitions": {}}
        if self._size < self.capacity:  # not wrapped yet: slots 0..size-1, in order
            order = torch.arange(self._size, device=self.device)
        else:
            order = (torch.arange(self.capacity, device=self.device) + self._cursor) % self.capacity
        held = self._storage[order]
        keys = list(held.keys())  # flat: one level of keys (iterating a TensorDict yields rows, not keys)
        return {"transitions": {str(key): held.get(key) for key in keys}}

    def load_state_dict(self, state: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """Hold exactly the transitions of a `state_dict`; with a smaller `capacity` than when it was taken, the
        newest `capacity` of them.

        Args:
            state (Mapping[str, Mapping[str, torch.Tensor]]): The output of `state_dict`.

        Raises:
            ValueError: When the transitions' layout is inconsistent (keys of different lengths).
        """
        self._storage, self._cursor, self._size = None, 0, 0
        transitions = dict(state["transitions"])
        if not transitions:
            return
        lengths = {len(value) for value in transitions.values()}
        if len(lengths) != 1:
            raise ValueError(f"replay buffer state: every key must hold as many transitions, got lengths {lengths}")
        self.extend(TensorDict(transitions, batch_size=[lengths.pop()]))
