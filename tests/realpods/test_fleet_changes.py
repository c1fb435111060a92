"""Behaviours 3 and 4 of issue 8 on the real node: the evaluation fleet changes while training runs (scaled up, a
pod deleted); training goes on in the same trainer pod and ends consistent, every live evaluator on its weights.
Then the PolicyGroup is deleted: its pods go, and so do their containers, folders and cgroups on the node."""

from __future__ import annotations

from realpods_helpers import SMALL_REQUESTS, TRAIN_SECONDS, pods_on_host, real_cartpole, real_pod, wait_for

from tests.operator.operator_cluster import apply, get_json

OUTLASTS_THE_FLEET_CHANGES = {
    "spec.train.targetEvalReturn": None,
    "spec.train.totalEnvSteps": 300 * 256,
    "spec.train.pod": real_pod(resources={**SMALL_REQUESTS, "limits": {"cpu": "250m"}}),
}
"""The example solves CartPole in a few seconds, before two evaluator pods could start: without its target, 300
versions of 256 env steps on a quarter of a core (about 40 ms of CPU each) train for about a minute."""


def _group(cluster, namespace: str, name: str) -> dict:
    group = get_json(cluster, "pg", name, "-n", namespace)
    phase = (group.get("status") or {}).get("phase", "")
    assert phase not in {"Failed", "Invalid"}, f"PolicyGroup went {phase}: {group.get('status')}"
    return group


def _weight_version(cluster, namespace: str, name: str) -> int:
    return ((_group(cluster, namespace, name).get("status") or {}).get("training") or {}).get("weightVersion", 0)


def _pods(cluster, namespace: str, role: str) -> list[dict]:
    return get_json(cluster, "pods", "-n", namespace, "-l", f"rlightning.io/role={role}")["items"]


def _running(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def _finish_consistent_in_one_trainer_pod(cluster, namespace: str, name: str, trainer_uid: str) -> dict:
    """Wait for Succeeded; assert one trainer pod ran the whole time, never restarted, and the end is consistent."""
    wait_for(
        "the PolicyGroup to succeed",
        lambda: (_group(cluster, namespace, name).get("status") or {}).get("phase") == "Succeeded",
        timeout=TRAIN_SECONDS,
        interval=2.0,
    )
    trainers = _pods(cluster, namespace, "train")
    assert [p["metadata"]["uid"] for p in trainers] == [trainer_uid], "the trainer pod was replaced"
    assert all(s.get("restartCount", 0) == 0 for s in trainers[0]["status"].get("containerStatuses", []))
    training = get_json(cluster, "pg", name, "-n", namespace)["status"]["training"]
    assert training["consistent"] is True
    return training


def test_a_fleet_scaled_up_and_losing_a_pod_while_training_stays_on_the_weights_and_deletes_cleanly(
    cluster, real_node, real_namespace, real_operator
):
    # One training run for three behaviours: scaled up, a pod deleted, the group deleted at the end.
    # Serve: the fleet stays at its scale after training (Stop, the default, would scale it to zero).
    serving = {"spec.eval.replicas": 1, "spec.eval.afterTraining": "Serve"}
    apply(cluster, real_namespace, real_cartpole("changed", **serving, **OUTLASTS_THE_FLEET_CHANGES))
    wait_for("weights to be published", lambda: _weight_version(cluster, real_namespace, "changed") >= 1, timeout=240)
    (trainer,) = _running(_pods(cluster, real_namespace, "train"))
    version_at_scale = _weight_version(cluster, real_namespace, "changed")

    cluster.kubectl("scale", "pg", "changed", "-n", real_namespace, "--replicas=3")
    wait_for("3 evaluators to run", lambda: len(_running(_pods(cluster, real_namespace, "eval"))) == 3, timeout=180)
    for ordinal in (1, 2):  # an evaluator logs this before its first episode and waits for weights to apply
        line = f"evaluator {ordinal} waiting for the first weights"
        wait_for(f"evaluator {ordinal} to wait for weights", lambda ordinal=ordinal, line=line: line in cluster.kubectl(
            "logs", f"changed-eval-{ordinal}", "-n", real_namespace).stdout)

    victim = next(p for p in _pods(cluster, real_namespace, "eval") if p["metadata"]["name"] == "changed-eval-0")
    cluster.kubectl("delete", "pod", "changed-eval-0", "-n", real_namespace, "--grace-period=0", "--force")
    wait_for(
        "a new changed-eval-0 to run",
        lambda: any(
            p["metadata"]["name"] == "changed-eval-0" and p["metadata"]["uid"] != victim["metadata"]["uid"]
            for p in _running(_pods(cluster, real_namespace, "eval"))
        ),
        timeout=180,
    )
    version_after_replacement = _weight_version(cluster, real_namespace, "changed")

    training = _finish_consistent_in_one_trainer_pod(cluster, real_namespace, "changed", trainer["metadata"]["uid"])
    assert training["weightVersion"] > version_at_scale and training["weightVersion"] >= version_after_replacement
    assert get_json(cluster, "pg", "changed", "-n", real_namespace)["status"]["replicas"] == 3

    # Deleting the group removes its pods (3 serving evaluators, the finished trainer) and their host state.
    pods = get_json(cluster, "pods", "-n", real_namespace)["items"]
    uids = {p["metadata"]["uid"] for p in pods}
    assert real_node.tasks_of({p["metadata"]["uid"] for p in _running(pods)}), "running pods have no containers"
    cluster.kubectl("delete", "pg", "changed", "-n", real_namespace, "--wait=false")
    wait_for("every pod of the PolicyGroup to be gone", lambda: not get_json(cluster, "pods", "-n", real_namespace)[
        "items"], timeout=180.0)
    wait_for("the node to drop the pods' containers, folders and cgroups", lambda: not pods_on_host(real_node, uids),
             timeout=60.0, explain=lambda: "\n".join(pods_on_host(real_node, uids)))
