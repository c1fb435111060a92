"""rlightning: train reinforcement-learning policies with DDP and keep an evaluation fleet's weights in sync.

The library that runs inside every pod and behind `rlightning run`. It never imports the operator.
Subpackages: `config`, `contract` and `launch` (pure, no torch), `policy`, `weights`, `runtime`.
"""

from rlightning.contract import VERSION as __version__

__all__ = ["__version__"]
