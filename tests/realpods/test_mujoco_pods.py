"""examples/halfcheetah.yaml applied to the cluster trains HalfCheetah-v5 (MuJoCo) in real pods: the runtime image
carries the `mujoco` extra, and the manifest needs no change but its length and the node's small requests."""

from __future__ import annotations

from pathlib import Path

import yaml

import devcluster
from realpods_helpers import real_pod, wait_until_succeeded

from tests.operator.operator_cluster import apply

HALFCHEETAH = Path(__file__).resolve().parents[2] / "examples" / "halfcheetah.yaml"
ENV_STEPS = 4096
"""Two updates of the example's 2,048 samples: enough to publish, train on the fleet's batches and evaluate."""


def test_the_halfcheetah_example_trains_in_real_pods(cluster, real_namespace, real_operator) -> None:
    group = yaml.safe_load(HALFCHEETAH.read_text())
    spec = group["spec"]
    spec.update(image=devcluster.IMAGE, imagePullPolicy="Never")
    spec["train"].update(totalEnvSteps=ENV_STEPS, pod=real_pod())
    spec["eval"]["pod"] = real_pod()
    apply(cluster, real_namespace, group)
    training = wait_until_succeeded(cluster, real_namespace, "halfcheetah")["training"]
    assert training["envSteps"] >= ENV_STEPS, training
    assert training["weightVersion"] >= 2 and training["consistent"] is True, training
