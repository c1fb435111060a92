"""Behaviours 3 and 4 of issue 8 on the real node: the evaluation fleet changes while training runs (scaled up, a
pod deleted); training goes on in the same trainer pod and ends consistent, every live evaluator on its weights."""

from __future__ import annotations

from realpods_helpers import TRAIN_SECONDS, real_cartpole, wait_for

from tests.operator.operator_cluster import apply, get_json


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


def test_scaling_up_while_training_brings_new_evaluators_onto_the_current_weights(
    cluster, real_namespace, real_operator
):
    # Serve: the fleet stays at its scale after training (Stop, the default, would scale it to zero).
    serving = {"spec.eval.replicas": 1, "spec.eval.afterTraining": "Serve"}
    apply(cluster, real_namespace, real_cartpole("scaled", **serving))
    wait_for("weights to be published", lambda: _weight_version(cluster, real_namespace, "scaled") >= 1, timeout=240)
    (trainer,) = _running(_pods(cluster, real_namespace, "train"))
    version_at_scale = _weight_version(cluster, real_namespace, "scaled")

    cluster.kubectl("scale", "pg", "scaled", "-n", real_namespace, "--replicas=3")
    wait_for("3 evaluators to run", lambda: len(_running(_pods(cluster, real_namespace, "eval"))) == 3, timeout=180)
    for ordinal in (1, 2):  # an evaluator logs this before its first episode and waits for weights to apply
        line = f"evaluator {ordinal} waiting for the first weights"
        wait_for(f"evaluator {ordinal} to wait for weights", lambda ordinal=ordinal, line=line: line in cluster.kubectl(
            "logs", f"scaled-eval-{ordinal}", "-n", real_namespace).stdout)

    training = _finish_consistent_in_one_trainer_pod(cluster, real_namespace, "scaled", trainer["metadata"]["uid"])
    assert training["weightVersion"] > version_at_scale
    assert get_json(cluster, "pg", "scaled", "-n", real_namespace)["status"]["replicas"] == 3


def test_a_deleted_evaluator_is_replaced_and_catches_up_without_stalling_the_trainer(
    cluster, real_namespace, real_operator
):
    apply(cluster, real_namespace, real_cartpole("kicked"))
    wait_for("weights to be published", lambda: _weight_version(cluster, real_namespace, "kicked") >= 1, timeout=240)
    (trainer,) = _running(_pods(cluster, real_namespace, "train"))
    victim = next(p for p in _pods(cluster, real_namespace, "eval") if p["metadata"]["name"] == "kicked-eval-0")

    cluster.kubectl("delete", "pod", "kicked-eval-0", "-n", real_namespace, "--grace-period=0", "--force")
    wait_for(
        "a new kicked-eval-0 to run",
        lambda: any(
            p["metadata"]["name"] == "kicked-eval-0" and p["metadata"]["uid"] != victim["metadata"]["uid"]
            for p in _running(_pods(cluster, real_namespace, "eval"))
        ),
        timeout=180,
    )
    version_after_replacement = _weight_version(cluster, real_namespace, "kicked")
    training = _finish_consistent_in_one_trainer_pod(cluster, real_namespace, "kicked", trainer["metadata"]["uid"])
    assert training["weightVersion"] >= version_after_replacement
