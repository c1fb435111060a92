"""Bad arguments to a sender are errors naming the argument and the rule, raised before anything is sent.

Ports: TRAJECTORIES 15.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlightning.trajectories import BatchStamp, TrajectoryIntake, TrajectorySender
from tests._ports import TRAJECTORIES


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"endpoints": []}, "endpoints: must name at least one"),
        ({"endpoints": ["trainer-0"]}, r"endpoints: 'trainer-0' must be host:port"),
        ({"endpoints": [":29700"]}, r"endpoints: ':29700' must be host:port"),
        ({"credits": 0}, "credits: must be >= 1"),
        ({"ack_timeout": 0.0}, "ack_timeout: must be > 0"),
    ],
    ids=["no-endpoints", "no-port", "no-host", "no-credits", "no-ack-timeout"],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    arguments = {"endpoints": ["127.0.0.1:1"], "ordinal": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        TrajectorySender(**arguments)


def test_send_checks_the_stamp_and_the_credits_before_sending():
    # Port 1 on loopback: nothing listens, so no rank is ever connected and nothing leaves this process.
    sender = TrajectorySender(["127.0.0.1:1"], ordinal=2, credits=1, ack_timeout=30.0)
    batch = TensorDict({"x": torch.zeros(3)}, batch_size=[3])
    try:
        with pytest.raises(ValueError, match="stamp.ordinal: must be this sender's ordinal 2"):
            sender.send(batch, BatchStamp(version=0, ordinal=1, sequence=1, env_steps=3))
        assert not sender.wait_for_credit(0.2)  # a credit is free, but no rank is connected
        sender.send(batch, BatchStamp(version=0, ordinal=2, sequence=1, env_steps=3))
        assert sender.counts.lost == 1 and sender.counts.sent == 0 and sender.in_flight == 0
    finally:
        sender.close()


def test_send_without_a_credit_is_an_error(intakes):
    port = TRAJECTORIES.port(15)
    intakes.append(TrajectoryIntake(port, bind_host="127.0.0.1"))  # never reads: nothing is acknowledged
    sender = TrajectorySender([f"127.0.0.1:{port}"], ordinal=0, credits=1, ack_timeout=30.0)
    batch = TensorDict({"x": torch.zeros(3)}, batch_size=[3])
    try:
        assert sender.wait_for_credit(10.0)
        sender.send(batch, BatchStamp(version=0, ordinal=0, sequence=1, env_steps=3))
        assert not sender.wait_for_credit(0.2)
        with pytest.raises(RuntimeError, match=r"no credit \(1 batches unacknowledged\)"):
            sender.send(batch, BatchStamp(version=0, ordinal=0, sequence=2, env_steps=3))
        assert (sender.counts.sent, sender.in_flight) == (1, 1)
    finally:
        sender.close()
