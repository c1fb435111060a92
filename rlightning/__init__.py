"""rlightning: train reinforcement-learning policies with DDP and keep an evaluation fleet's weights in sync.

The library that runs inside every pod and behind `rlightning run`. It never imports the operator.
Subpackages: `config`, `contract` and `launch` (pure, no torch), `policy`, `weights`, `runtime`.
"""

__version__ = "0.1.0"
