"""One reconcile against an in-memory API (same verbs and error classes as `_kube.KubeClient`)."""

from __future__ import annotations

import asyncio
import copy
import datetime
import functools
import gc
import itertools
import threading

import kopf
import pytest
from kopf._cogs.clients import watching

from rlightning import contract
from rlightning_operator import _kube as kube
from rlightning_operator import _handlers, _pods, _watches
from rlightning_operator._builders import NetworkPolicyOptions
from rlightning_operator._reconcile import InvalidSpecError, Reconciler
from rlightning_operator._refresher import Refresher
from rlightning_operator._settings import OperatorSettings

from operator_manifests import edited, example_document

NS = "ns"


def merge(target, patch):
    """RFC 7386 JSON merge patch."""
    for name, value in patch.items():
        if value is None:
            target.pop(name, None)
        elif isinstance(value, dict) and isinstance(target.get(name), dict):
            merge(target[name], value)
        else:
            target[name] = copy.deepcopy(value)
    return target


class FakeApi:
    """Objects by (kind, namespace, name); records every request."""

    def __init__(self):
        self.objects = {}
        self.requests = []
        self.uids = itertools.count(1)
        self.fail_next = None
        self.deleted = []

    def _check(self, verb):
        self.requests.append(verb)
        if self.fail_next:
            error, self.fail_next = self.fail_next, None
            raise error

    def read(self, kind, namespace, name):
        self._check("get")
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found)

    def list(self, kind, namespace, label_selector):
        self._check("list")
        wanted = dict(term.split("=") for term in label_selector.split(","))
        return [copy.deepcopy(o) for (k, ns, _), o in sorted(self.objects.items())
                if (k, ns) == (kind, namespace)
                and all((o["metadata"].get("labels") or {}).get(key) == value for key, value in wanted.items())]

    def create(self, manifest):
        self._check("create")
        key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        if key in self.objects:
            raise kube.Conflict("create", "/x", 409, "already exists")
        stored = copy.deepcopy(manifest)
        stored["metadata"]["uid"] = f"uid-{next(self.uids)}"
        self.objects[key] = stored
        return copy.deepcopy(stored)

    def patch(self, kind, namespace, name, body, subresource=None):
        self._check(f"patch{'/' + subresource if subresource else ''}")
        if (kind, namespace, name) not in self.objects:
            raise kube.PermanentApiError("patch", "/x", 404, "not found")
        return copy.deepcopy(merge(self.objects[(kind, namespace, name)], body))

    def delete(self, kind, namespace, name, propagation="Foreground", grace_period_seconds=None):
        self._check("delete")
        self.objects.pop((kind, namespace, name), None)
        self.deleted.append((kind, name, grace_period_seconds))


def group(**edit):
    body = edited(example_document(), **edit)
    body["metadata"].update(namespace=NS, uid="pg-uid", generation=1)
    return body


@pytest.fixture
def api():
    api = FakeApi()
    api.objects[(contract.KIND, NS, "cartpole")] = group()
    return api


@pytest.fixture
def events():
    return []


@pytest.fixture
def reconciler(api, events):
    return Reconciler(api, lambda obj, type_, reason, message: events.append((type_, reason, message)))


def children(api):
    return sorted((kind, name) for kind, _, name in api.objects if kind != contract.KIND)


def test_first_reconcile_creates_children_and_writes_status_once(api, events, reconciler):
    outcome = reconciler.reconcile(group())
    assert [a.type for a in outcome.actions] == ["create"] * 10
    assert len(children(api)) == 10
    assert api.requests.count("patch/status") == 1
    status = api.objects[(contract.KIND, NS, "cartpole")]["status"]
    assert status["phase"] == "Pending" and status["eval"]["summary"] == "0/2"
    assert api.requests.count("get") == 0, "a group with no status has no children to read"
    assert [e[1] for e in events] == ["Created"], "one Event names every child"
    assert events[0][2].startswith("created ConfigMap cartpole-spec, ServiceAccount cartpole-runtime, ")
    assert events[0][2].endswith("Job cartpole-train (attempt 0), Service cartpole-eval, StatefulSet cartpole-eval")
    for (kind, _, _), obj in api.objects.items():
        if kind != contract.KIND:
            assert obj["metadata"]["ownerReferences"][0]["uid"] == "pg-uid"


def test_the_network_policy_is_created_once_and_patched_only_when_it_differs(api, events):
    reconciler = Reconciler(api, lambda *event: events.append(event), NetworkPolicyOptions())
    body = group()
    outcome = reconciler.reconcile(body)
    assert ("create", "NetworkPolicy") in [(a.type, a.kind) for a in outcome.actions]
    policy = api.objects[("NetworkPolicy", NS, "cartpole-train")]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "pg-uid"
    body["status"] = api.objects[(contract.KIND, NS, "cartpole")]["status"]
    api.requests.clear()
    assert reconciler.reconcile(body).actions == [] and set(api.requests) <= {"get", "list"}
    outcome = reconciler.reconcile(group(**{"spec.ports.metrics": 9500}))
    assert ("patch", "NetworkPolicy") in [(a.type, a.kind) for a in outcome.actions]
    assert api.objects[("NetworkPolicy", NS, "cartpole-train")]["spec"]["ingress"][1]["ports"][0]["port"] == 9500


def test_second_reconcile_is_reads_only(api, reconciler):
    body = group()
    reconciler.reconcile(body)
    body["status"] = api.objects[(contract.KIND, NS, "cartpole")]["status"]
    api.requests.clear()
    outcome = reconciler.reconcile(body)
    assert outcome.actions == [] and not outcome.status_written
    assert set(api.requests) <= {"get", "list"}  # list: the pods, while none is ready


def test_scale_patches_only_the_statefulset(api, reconciler):
    reconciler.reconcile(group())
    api.requests.clear()
    outcome = reconciler.reconcile(group(**{"spec.eval.replicas": 9}))
    assert [(a.type, a.kind) for a in outcome.actions] == [("scale", "StatefulSet")]
    assert api.objects[("StatefulSet", NS, "cartpole-eval")]["spec"]["replicas"] == 9


def test_template_change_recreates_the_job_over_two_reconciles(api, reconciler):
    reconciler.reconcile(group())
    old_uid = api.objects[("Job", NS, "cartpole-train")]["metadata"]["uid"]
    first = reconciler.reconcile(group(**{"spec.train.nodes": 2}))
    assert ("recreate", "Job") in [(a.type, a.kind) for a in first.actions]
    assert ("Job", "cartpole-train") not in children(api)
    second = reconciler.reconcile(group(**{"spec.train.nodes": 2}))
    assert [(a.type, a.kind) for a in second.actions] == [("create", "Job")]
    job = api.objects[("Job", NS, "cartpole-train")]
    assert job["spec"]["completions"] == 2 and job["metadata"]["uid"] != old_uid


def test_create_conflict_reads_and_patches(api, reconciler):
    reconciler.reconcile(group())
    api.objects[("ConfigMap", NS, "cartpole-spec")]["data"] = {"stale": "yes"}
    api.objects[("ConfigMap", NS, "cartpole-spec")]["metadata"]["annotations"] = {}

    original_read = api.read
    missed: list[str] = []

    def stale_read(kind, namespace, name):  # the first read misses the object: create then conflicts
        if kind == "ConfigMap" and not missed:
            missed.append(name)
            return None
        return original_read(kind, namespace, name)

    api.read = stale_read
    outcome = reconciler.reconcile(group())
    api.read = original_read
    assert missed == ["cartpole-spec"]
    assert [(a.type, a.kind) for a in outcome.actions] == [("patch", "ConfigMap")], "what was done, after the 409"
    assert contract.SPEC_FILE_NAME in api.objects[("ConfigMap", NS, "cartpole-spec")]["data"]


def test_a_fresh_groups_leftover_children_are_read_after_409_and_kept(api, events):
    # a first pass whose status write was lost (the operator restarted): the group has no status, its children exist
    Reconciler(api, lambda *event: None).reconcile(group())
    before = {key: obj["metadata"]["uid"] for key, obj in api.objects.items() if key[0] != contract.KIND}
    del api.objects[(contract.KIND, NS, "cartpole")]["status"]
    api.requests.clear()
    outcome = Reconciler(api, lambda *event: events.append(event)).reconcile(group())
    assert outcome.actions == [] and events == []
    assert {key: obj["metadata"]["uid"] for key, obj in api.objects.items() if key[0] != contract.KIND} == before
    assert api.requests.count("create") == 10 and api.requests.count("get") == 10, "each read only after its 409"
    assert api.requests.count("patch/status") == 1


def test_invalid_spec_sets_condition_warns_once_and_raises(api, events, reconciler):
    body = group(**{"spec.train.nodes": 0})
    with pytest.raises(InvalidSpecError, match="spec.train.nodes"):
        reconciler.reconcile(body)
    status = api.objects[(contract.KIND, NS, "cartpole")]["status"]
    assert status["phase"] == "Invalid"
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert valid["status"] == "False" and "spec.train.nodes" in valid["message"]
    assert events == [("Warning", "InvalidSpec", valid["message"])]
    assert children(api) == []
    body["status"] = status
    with pytest.raises(InvalidSpecError):
        reconciler.reconcile(body)
    assert len(events) == 1, "no Warning per retry"


@pytest.mark.parametrize("spec", [None, "text", {"env": "CartPole"}, {"env": {"id": ""}, "eval": []}])
def test_strange_objects_are_invalid_not_crashes(api, reconciler, spec):
    body = group()
    body["spec"] = spec
    with pytest.raises(InvalidSpecError):
        reconciler.reconcile(body)
    assert api.objects[(contract.KIND, NS, "cartpole")]["status"]["phase"] == "Invalid"


def test_transient_error_propagates_for_retry(api, reconciler):
    api.fail_next = kube.TransientApiError("get", "/x", 503, "unavailable")
    with pytest.raises(kube.TransientApiError):
        reconciler.reconcile(group())


def test_status_write_never_touches_training(api, reconciler):
    api.objects[(contract.KIND, NS, "cartpole")]["status"] = {"training": {"iteration": 7, "weightVersion": 3}}
    reconciler.reconcile(group())
    assert api.objects[(contract.KIND, NS, "cartpole")]["status"]["training"] == {"iteration": 7, "weightVersion": 3}


def test_foreign_child_is_a_conflict_not_a_takeover(api, events, reconciler):
    foreign = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "cartpole-spec", "namespace": NS,
                            "ownerReferences": [{"uid": "someone", "controller": True, "kind": "X", "name": "x",
                                                 "apiVersion": "v1"}]},
               "data": {"mine": "1"}}
    api.objects[("ConfigMap", NS, "cartpole-spec")] = foreign
    outcome = reconciler.reconcile(group())
    assert api.objects[("ConfigMap", NS, "cartpole-spec")]["data"] == {"mine": "1"}
    ready = next(c for c in outcome.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Conflict" and "ConfigMap/cartpole-spec" in ready["message"]
    assert outcome.blocked == ["ConfigMap/cartpole-spec"], "the caller looks again later"
    assert [(e[0], e[1]) for e in events].count(("Warning", "Conflict")) == 1
    body = group()
    body["status"] = api.objects[(contract.KIND, NS, "cartpole")]["status"]
    reconciler.reconcile(body)
    assert [(e[0], e[1]) for e in events].count(("Warning", "Conflict")) == 1, "one Warning per transition"


def test_status_refresh_reads_two_children_and_acts_on_nothing(api, reconciler):
    reconciler.reconcile(group())
    api.objects[("StatefulSet", NS, "cartpole-eval")]["status"] = {"replicas": 2, "readyReplicas": 2}
    api.objects[("Job", NS, "cartpole-train")]["status"] = {"ready": 1}
    del api.objects[("Service", NS, "cartpole-eval")]  # repaired by a reconcile, not by a status refresh
    body = group()
    body["status"] = api.objects[(contract.KIND, NS, "cartpole")]["status"]
    api.requests.clear()
    outcome = reconciler.refresh_status(body)
    assert outcome.actions == [] and api.requests == ["get", "get", "patch/status"]
    status = api.objects[(contract.KIND, NS, "cartpole")]["status"]
    assert status["phase"] == "Running" and status["eval"]["summary"] == "2/2"
    assert ("Service", NS, "cartpole-eval") not in api.objects


@pytest.mark.parametrize(("code", "reason"), [(403, "Forbidden"), (422, "Invalid")])
def test_a_refusal_is_reported_once_and_still_raised_for_retry(api, events, reconciler, code, reason):
    reconciler.reconcile(group())
    body = group(**{"spec.eval.replicas": 5})
    body["status"] = api.objects[(contract.KIND, NS, "cartpole")]["status"]
    refusal = kube.PermanentApiError("patch", "/apis/apps/v1/x", code, "statefulsets is forbidden: nope")
    events.clear()
    for _ in range(2):
        api.fail_next = refusal
        with pytest.raises(kube.PermanentApiError):
            reconciler.reconcile(body)
        body["status"] = api.objects[(contract.KIND, NS, "cartpole")]["status"]
    ready = next(c for c in body["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert "statefulsets is forbidden: nope" in ready["message"]
    assert {c["type"] for c in body["status"]["conditions"]} == {"Valid", "TrainersReady", "EvaluatorsReady",
                                                                  "CheckpointsPersistent", "Ready"}
    assert events == [("Warning", reason, ready["message"])], "one Warning, not one per retry"
    outcome = reconciler.reconcile(body)  # RBAC fixed: the next retry succeeds and Ready is recomputed
    assert [(a.type, a.kind) for a in outcome.actions] == [("scale", "StatefulSet")]
    assert next(c for c in outcome.status["conditions"] if c["type"] == "Ready")["reason"] != reason


def test_reconciles_of_one_group_never_overlap_even_when_deleted_and_created_again(api, reconciler):
    inside, release, overlaps = threading.Event(), threading.Event(), []
    active = []

    def slow(body, namespace, name):
        active.append(name)
        overlaps.append(len(active))
        inside.set()
        release.wait(10)
        active.remove(name)

    reconciler._reconcile_locked = slow
    first = threading.Thread(target=reconciler.reconcile, args=(group(),))
    first.start()
    assert inside.wait(10)
    gc.collect()  # the group was deleted meanwhile: nothing may drop the lock the first reconcile holds
    second = threading.Thread(target=reconciler.reconcile, args=(group(),))
    second.start()
    second.join(0.3)
    assert second.is_alive(), "the second reconcile waits for the first"
    release.set()
    first.join(10)
    second.join(10)
    assert overlaps == [1, 1]
    del first, second
    gc.collect()
    assert len(reconciler._locks) == 0, "locks of idle groups are released"


def test_a_service_with_a_cluster_ip_is_replaced_by_a_headless_one_in_one_reconcile(api, events, reconciler):
    reconciler.reconcile(group())
    service = api.objects[("Service", NS, "cartpole-train")]
    service["spec"]["clusterIP"] = "10.0.0.9"
    api.requests.clear()
    outcome = reconciler.reconcile(group())
    assert [(a.type, a.kind) for a in outcome.actions] == [("recreate", "Service")] and not outcome.blocked
    assert api.objects[("Service", NS, "cartpole-train")]["spec"]["clusterIP"] == "None"
    assert "patch" not in api.requests and api.requests.count("delete") == 1
    assert events[-1][1] == "Recreating"


def test_a_crash_loop_is_reported_in_status_and_by_one_warning(api, events, reconciler):
    crashing = {
        "kind": "Pod",
        "metadata": {"name": "cartpole-eval-1", "namespace": NS,
                     "labels": {contract.LABEL_GROUP: "cartpole", contract.LABEL_ROLE: "eval"}},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "eval", "ready": False, "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}}}]},
    }
    watch_pod(api, reconciler, crashing)
    body = group()
    for _ in range(2):  # the second pass finds the same problem: no second Warning
        reconciler.reconcile(body)
        body["status"] = api.objects[(contract.KIND, NS, "cartpole")]["status"]
    ready = next(c for c in body["status"]["conditions"] if c["type"] == "EvaluatorsReady")
    assert ready["reason"] == "CrashLoopBackOff" and "exit code 2" in ready["message"]
    warnings = [e for e in events if e[0] == "Warning"]
    assert [(e[1], "cartpole-eval-1" in e[2]) for e in warnings] == [("CrashLoopBackOff", True)]


def watch_pod(api, reconciler, pod, deleted=False):
    """A pod stored (or removed) and delivered by the pod watch to the reconciler, as the handler does."""
    key = ("Pod", NS, pod["metadata"]["name"])
    if deleted:
        api.objects.pop(key, None)
    else:
        api.objects[key] = pod
    reconciler.cache.note_pod(pod, deleted=deleted)


def trainer_pod(name, attempt, **status):
    return {"kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {
        contract.LABEL_GROUP: "cartpole", contract.LABEL_ROLE: "train", contract.LABEL_ATTEMPT: str(attempt)}},
        "status": status}


def stored_status(api):
    return api.objects[(contract.KIND, NS, "cartpole")]["status"]


def test_a_failed_trainer_pod_restarts_the_gang_under_the_next_attempt(api, events, reconciler):
    reconciler.reconcile(group())
    assert api.objects[("Job", NS, "cartpole-train")]["metadata"]["labels"][contract.LABEL_ATTEMPT] == "0"
    api.objects[("Job", NS, "cartpole-train")]["status"] = {"ready": 0, "failed": 1}
    failed = trainer_pod("cartpole-train-0-abcde", 0, phase="Failed", containerStatuses=[
        {"name": "train", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}])
    api.objects[("Pod", NS, "cartpole-train-0-abcde")] = failed
    body = group()
    body["status"] = stored_status(api)
    events.clear()
    outcome = reconciler.refresh_status(body)  # a pod event: the refresh finds the loss and reconciles whole
    assert [(a.type, a.kind) for a in outcome.actions] == [("recreate", "Job")]
    assert ("Job", NS, "cartpole-train") not in api.objects  # deleted (Foreground); its DELETED event comes back
    status = stored_status(api)
    assert status["phase"] == "Restarting" and status["train"]["attempt"] == 1
    assert {k: status["restarts"][k] for k in ("total", "failures", "disruptions", "reason", "pod")} == {
        "total": 1, "failures": 1, "disruptions": 0, "reason": "Failed", "pod": "cartpole-train-0-abcde"}
    restarting = next(c for c in status["conditions"] if c["type"] == "TrainerRestarting")
    assert restarting["status"] == "True" and "cartpole-train-0-abcde" in restarting["message"]
    warnings = [(e[1], e[2]) for e in events if e[0] == "Warning"]
    assert warnings[0][0] == "TrainerRestarting" and "attempt 1 replaces attempt 0" in warnings[0][1]
    assert "exit code 1" in warnings[0][1] and "failure 1 of spec.train.maxRestarts 3" in warnings[0][1]
    assert ("CheckpointsNotPersistent" in [w[0] for w in warnings]), "no claim: said loudly at each restart"

    body["status"] = stored_status(api)
    outcome = reconciler.reconcile(body)  # the old attempt's pod is still there: no new Job yet
    assert [a.type for a in outcome.actions] == ["wait"] and ("Job", NS, "cartpole-train") not in api.objects
    del api.objects[("Pod", NS, "cartpole-train-0-abcde")]
    events.clear()
    outcome = reconciler.reconcile(body)
    assert [(a.type, a.kind) for a in outcome.actions] == [("create", "Job")]
    job = api.objects[("Job", NS, "cartpole-train")]
    assert job["metadata"]["labels"][contract.LABEL_ATTEMPT] == "1"
    assert job["spec"]["template"]["metadata"]["labels"][contract.LABEL_ATTEMPT] == "1"
    assert ("Normal", "Created", "created Job cartpole-train (attempt 1)") in events
    assert stored_status(api)["restarts"]["total"] == 1, "counted once"


def evicted(pod, node, deleted_at="2026-12-01T10:00:30Z"):
    """`pod` on `node` as the node lifecycle controller and the taint manager leave it once the node stopped
    answering: not ready, DisruptionTarget DeletionByTaintManager, deleted (30 s grace period)."""
    pod = copy.deepcopy(pod)
    pod["spec"] = {"nodeName": node}
    pod["metadata"].update(deletionTimestamp=deleted_at, deletionGracePeriodSeconds=30)
    pod["status"]["conditions"] = [
        {"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-01T09:55:00Z"},
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
         "lastTransitionTime": "2026-12-01T10:00:00Z"}]
    return pod


def test_pods_stranded_on_a_silent_node_are_force_deleted_and_the_next_attempt_forms(api, events, reconciler):
    reconciler.reconcile(group())
    lost = evicted(trainer_pod("cartpole-train-0-abcde", 0, phase="Running"), "node-a")
    watch_pod(api, reconciler, lost)
    evaluator = evicted({"kind": "Pod", "metadata": {"name": "cartpole-eval-1", "namespace": NS, "labels": {
        contract.LABEL_GROUP: "cartpole", contract.LABEL_ROLE: "eval"}}, "status": {"phase": "Running"}}, "node-a")
    watch_pod(api, reconciler, evaluator)
    events.clear()
    outcome = reconciler.refresh_status(group())  # the loss restarts the gang; the old pod holds the old Job
    assert stored_status(api)["train"]["attempt"] == 1 and [e[1] for e in events][0] == "TrainerRestarting"
    assert ("Pod", "cartpole-train-0-abcde", 0) in api.deleted and ("Pod", "cartpole-eval-1", 0) in api.deleted
    unreachable = [e[2] for e in events if e[1] == "NodeUnreachable"]
    assert unreachable == ["node node-a unreachable since 2026-12-01T09:55:00Z: force-deleted pods "
                           "cartpole-eval-1, cartpole-train-0-abcde"], events
    assert [a.type for a in outcome.actions] == ["recreate"]

    watch_pod(api, reconciler, lost, deleted=True)
    watch_pod(api, reconciler, evaluator, deleted=True)
    body = group()
    body["status"] = stored_status(api)
    events.clear()
    outcome = reconciler.reconcile(body)
    assert [(a.type, a.kind) for a in outcome.actions] == [("create", "Job")], "no pod of attempt 0 is left"
    assert not [e for e in events if e[1] == "NodeUnreachable"], "each pod is force-deleted once"
    assert named_unreachable(stored_status(api)) == {"TrainersReady", "EvaluatorsReady", "Ready"}, "until replaced"

    api.objects[("Job", NS, "cartpole-train")]["status"] = {"ready": 1}  # attempt 1 runs elsewhere
    reconciler.refresh_status({**group(), "status": copy.deepcopy(stored_status(api))})
    assert named_unreachable(stored_status(api)) == {"EvaluatorsReady", "Ready"}, "the trainers are replaced"
    api.objects[("StatefulSet", NS, "cartpole-eval")]["status"] = {"replicas": 2, "readyReplicas": 2}
    reconciler.refresh_status({**group(), "status": copy.deepcopy(stored_status(api))})
    assert named_unreachable(stored_status(api)) == set(), "the evaluators are replaced too"
    api.objects[("StatefulSet", NS, "cartpole-eval")]["status"] = {"replicas": 2, "readyReplicas": 1}
    reconciler.refresh_status({**group(), "status": copy.deepcopy(stored_status(api))})
    assert named_unreachable(stored_status(api)) == set(), "a later problem is not the node's: it is forgotten"


def named_unreachable(status):
    """The types of the conditions whose message names node-a as unreachable since its pods were marked not ready."""
    return {c["type"] for c in status["conditions"]
            if c["message"].endswith("; node node-a unreachable since 2026-12-01T09:55:00Z")}


def test_an_evicted_evaluator_is_force_deleted_at_once_and_rechecked_when_the_servers_clock_is_ahead(
        api, events, reconciler):
    reconciler.reconcile(group())
    body = group()
    body["status"] = stored_status(api)

    def evicted_evaluator(ordinal, deletion_in_seconds):  # deletionTimestamp: the deletion plus its 30 s grace
        at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=deletion_in_seconds)
        return evicted({"kind": "Pod", "metadata": {"name": f"cartpole-eval-{ordinal}", "namespace": NS, "labels": {
            contract.LABEL_GROUP: "cartpole", contract.LABEL_ROLE: "eval"}}, "status": {"phase": "Running"}}, "node-b",
            deleted_at=at.strftime("%Y-%m-%dT%H:%M:%SZ"))

    watch_pod(api, reconciler, evicted_evaluator(0, 20))  # deleted 10 s ago: its grace period is not waited for
    reconciler.refresh_status(body)
    assert ("Pod", "cartpole-eval-0", 0) in api.deleted
    watch_pod(api, reconciler, evicted_evaluator(1, 50))  # deleted "in 20 s" by the API server's clock
    outcome = reconciler.refresh_status(body)
    assert ("Pod", "cartpole-eval-1", 0) not in api.deleted
    assert outcome.recheck_seconds is not None and 18 <= outcome.recheck_seconds <= 22, outcome.recheck_seconds


def test_a_pass_given_a_body_from_before_a_gang_restart_builds_the_new_attempt(api, events, reconciler):
    reconciler.reconcile(group())
    before = group()
    before["status"] = copy.deepcopy(stored_status(api))  # attempt 0: an event queued before the restart's write
    api.objects[("Job", NS, "cartpole-train")]["status"] = {"ready": 0, "failed": 1}
    api.objects[("Pod", NS, "p0")] = trainer_pod("p0", 0, phase="Failed", containerStatuses=[
        {"name": "train", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}])
    outcome = reconciler.refresh(NS, "cartpole", full=False)  # the restart: attempt 1 written, the Job deleted
    assert outcome is not None and [(a.type, a.kind) for a in outcome.actions] == [("recreate", "Job")]
    del api.objects[("Pod", NS, "p0")]

    outcome = reconciler.reconcile(before)
    assert [(a.type, a.kind) for a in outcome.actions] == [("create", "Job")]
    assert api.objects[("Job", NS, "cartpole-train")]["metadata"]["labels"][contract.LABEL_ATTEMPT] == "1"
    assert stored_status(api)["train"]["attempt"] == 1 and stored_status(api)["restarts"]["total"] == 1


def test_a_deleted_trainer_pod_is_a_disruption_that_never_fails_the_group(api, events, reconciler):
    body = group(**{"spec.train.maxRestarts": 0})
    reconciler.reconcile(body)
    api.objects[("Job", NS, "cartpole-train")]["status"] = {"ready": 0}
    for attempt in range(3):
        pod = trainer_pod(f"p{attempt}", attempt, phase="Running")
        pod["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
        watch_pod(api, reconciler, pod)
        body["status"] = stored_status(api)
        reconciler.reconcile(body)
        watch_pod(api, reconciler, pod, deleted=True)
        body["status"] = stored_status(api)
        reconciler.reconcile(body)
        api.objects[("Job", NS, "cartpole-train")]["status"] = {"ready": 0}
    status = stored_status(api)
    assert status["train"]["attempt"] == 3 and status["phase"] == "Restarting"
    assert (status["restarts"]["failures"], status["restarts"]["disruptions"]) == (0, 3)


def test_a_failure_with_no_restart_left_fails_the_group_and_warns_once(api, events, reconciler):
    body = group(**{"spec.train.maxRestarts": 0})
    reconciler.reconcile(body)
    api.objects[("Job", NS, "cartpole-train")]["status"] = {
        "failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    events.clear()
    for _ in range(2):
        body["status"] = stored_status(api)
        outcome = reconciler.reconcile(body)
    assert "Job" not in [a.kind for a in outcome.actions]
    status = stored_status(api)
    assert status["phase"] == "Failed" and status["train"]["attempt"] == 0
    ready = next(c for c in status["conditions"] if c["type"] == "TrainersReady")
    assert ready["reason"] == "MaxRestartsReached" and "0 of spec.train.maxRestarts 0" in ready["message"]
    assert [e[1] for e in events if e[0] == "Warning"] == ["MaxRestartsReached"]


@pytest.mark.parametrize(("after", "replicas", "summary"), [("Stop", 0, "0/0:stopped"), ("Serve", 2, "0/2:serving")])
def test_evaluators_stop_or_serve_once_training_has_ended(api, reconciler, after, replicas, summary):
    body = group(**{"spec.eval.afterTraining": after})
    reconciler.reconcile(body)
    api.objects[("Job", NS, "cartpole-train")]["status"] = {
        "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    body["status"] = stored_status(api)
    reconciler.refresh_status(body)  # the Job's event: a refresh that scales the fleet to zero when it should
    assert api.objects[("StatefulSet", NS, "cartpole-eval")]["spec"]["replicas"] == replicas
    status = stored_status(api)
    assert status["phase"] == "Succeeded" and status["eval"]["summary"] == summary
    assert status["eval"]["afterTraining"] == ("Stopped" if after == "Stop" else "Serving")


@pytest.mark.parametrize("group_deleted", [False, True], ids=["same-group", "after-the-group-was-deleted"])
def test_a_pod_gone_before_the_pass_is_known_by_its_last_watched_state(api, events, reconciler, group_deleted):
    reconciler.reconcile(group())
    # kubectl delete pod: the watch saw it deleted; by the pass it is gone and the Job failed because of it.
    deleted = trainer_pod("cartpole-train-0-abcde", 0, phase="Failed")
    deleted["metadata"]["deletionTimestamp"] = "2026-12-01T10:01:15Z"
    reconciler.cache.note_pod(deleted)
    reconciler.cache.note_pod({**group(), "kind": "PolicyGroup"})  # not a pod of a role: ignored
    if group_deleted:  # a pass finds the PolicyGroup gone: its pods are no evidence for a successor
        stored = api.objects.pop((contract.KIND, NS, "cartpole"))
        reconciler.cache.note_group(stored, deleted=True)
        assert reconciler.refresh(NS, "cartpole", full=True) is None
        api.objects[(contract.KIND, NS, "cartpole")] = stored  # created again under the same name
    api.objects[("Job", NS, "cartpole-train")]["status"] = {
        "failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    body = group()
    body["status"] = stored_status(api)
    reconciler.reconcile(body)
    restarts = stored_status(api)["restarts"]
    lost = (0, 1) if group_deleted else (1, 0)  # a Job failure without evidence counts as a failure
    assert (restarts["disruptions"], restarts["failures"]) == lost
    assert (restarts["reason"] == "PodDeleted") is not group_deleted


def versioned(api):
    """Make the fake API give each patch's result a new resourceVersion (10, 11, ...), as the API server does."""
    versions = itertools.count(10)
    patch = api.patch

    def versioned_patch(*args, **kwargs):
        stored = patch(*args, **kwargs)
        stored["metadata"]["resourceVersion"] = str(next(versions))
        return stored
    api.patch = versioned_patch


def test_a_pass_takes_the_group_as_watched_and_reads_it_while_its_own_status_write_is_not_back(api, reconciler):
    versioned(api)
    api.requests.clear()
    assert reconciler.read_group(NS, "cartpole") is not None and api.requests == ["get"], "not watched yet: read"
    watched = group()
    watched["metadata"]["resourceVersion"] = "5"
    reconciler.cache.note_group(watched)
    api.requests.clear()
    assert reconciler.read_group(NS, "cartpole")["metadata"]["resourceVersion"] == "5" and api.requests == []
    reconciler.reconcile(watched)  # writes status: resourceVersion 10
    assert reconciler.read_group(NS, "cartpole")["status"] == stored_status(api)
    api.requests.clear()
    assert reconciler.read_group(NS, "cartpole")["status"] == stored_status(api) and api.requests == []
    reconciler.cache.note_group(watched)  # another write's event before the write's own: older or newer? read
    reconciler.read_group(NS, "cartpole")
    assert api.requests == ["get"]
    echo = copy.deepcopy(api.objects[(contract.KIND, NS, "cartpole")])
    echo["metadata"]["resourceVersion"] = "10"
    reconciler.cache.note_group(echo)  # the write came back through the watch; what follows is newer
    later = {**echo, "metadata": {**echo["metadata"], "resourceVersion": "11"}}
    reconciler.cache.note_group(later)
    assert reconciler.read_group(NS, "cartpole")["metadata"]["resourceVersion"] == "11"
    reconciler.cache.note_group(later, deleted=True)
    api.requests.clear()
    reconciler.read_group(NS, "cartpole")
    assert api.requests == ["get"]


def test_a_status_write_whose_event_came_before_its_response_costs_no_read_later(monkeypatch, api, reconciler):
    """The watch may deliver a status write's event before the writing thread handles the response."""
    monkeypatch.setattr("rlightning_operator._watchcache.STATUS_ECHO_SECONDS", 0.0)  # any later pass: echo overdue
    versioned(api)
    patch = api.patch

    def echoed_first(*args, **kwargs):
        stored = patch(*args, **kwargs)
        reconciler.cache.note_group(copy.deepcopy(stored))  # the kopf thread, before this one sees the response
        return stored
    api.patch = echoed_first
    watched = group()
    watched["metadata"]["resourceVersion"] = "5"
    reconciler.cache.note_group(watched)
    reconciler.reconcile(watched)
    api.requests.clear()
    assert reconciler.read_group(NS, "cartpole")["status"] == stored_status(api) and api.requests == []


@pytest.mark.parametrize(("training", "reads"), [(None, []), ({"iteration": 3}, ["get"])],
                         ids=["kopf-annotation-patch", "trainer-report"])
def test_an_event_that_hides_the_status_write_s_own_is_taken_when_it_carries_the_written_status(
        api, reconciler, training, reads):
    """kopf delivers the last of the events within its batch window: its annotation patch right after a status write
    can hide the write's own event. That event carries the written status and is taken; one with another status
    (another writer's, or older) leaves the body unknown until the write's own arrives, and a pass reads it."""
    versioned(api)
    watched = group()
    watched["metadata"]["resourceVersion"] = "5"
    reconciler.cache.note_group(watched)
    reconciler.reconcile(watched)  # writes status: resourceVersion 10
    event = copy.deepcopy(api.objects[(contract.KIND, NS, "cartpole")])
    event["metadata"]["resourceVersion"] = "11"
    if training is not None:
        event["status"]["training"] = training
    reconciler.cache.note_group(event)
    api.requests.clear()
    kept = reconciler.read_group(NS, "cartpole")
    assert api.requests == reads
    assert (kept["metadata"].get("resourceVersion") == "11") is (not reads), "the event itself when taken"


def test_a_status_refresh_of_watched_children_reads_nothing_and_a_changed_child_reconciles_whole(api, reconciler):
    reconciler.reconcile(group())
    api.objects[("StatefulSet", NS, "cartpole-eval")]["status"] = {"replicas": 2, "readyReplicas": 2}
    api.objects[("Job", NS, "cartpole-train")]["status"] = {"ready": 1}
    for key in (("Job", NS, "cartpole-train"), ("StatefulSet", NS, "cartpole-eval")):
        reconciler.cache.note_child(api.objects[key])
    reconciler.cache.note_group(api.objects[(contract.KIND, NS, "cartpole")])
    api.requests.clear()
    outcome = reconciler.refresh_status(reconciler.read_group(NS, "cartpole"))
    assert outcome.actions == [] and api.requests == ["patch/status"], "the watches gave the group and its children"
    assert stored_status(api)["eval"]["summary"] == "2/2"
    scaled = copy.deepcopy(api.objects[("StatefulSet", NS, "cartpole-eval")])
    scaled["spec"]["replicas"] = 5  # scaled by hand: the refresh sees it and reconciles whole
    api.objects[("StatefulSet", NS, "cartpole-eval")] = scaled
    reconciler.cache.note_child(scaled)
    outcome = reconciler.refresh_status(reconciler.read_group(NS, "cartpole"))
    assert [(a.type, a.kind) for a in outcome.actions] == [("scale", "StatefulSet")]
    assert api.objects[("StatefulSet", NS, "cartpole-eval")]["spec"]["replicas"] == 2


@pytest.mark.parametrize("rolling", [False, True], ids=["trainers-never-report", "rolling-update"])
def test_a_group_left_alone_costs_no_request_across_its_rechecks(monkeypatch, api, reconciler, rolling):
    """Trainers that are ready but never report (kwok's), or evaluators rolling: the status asks for rechecks, and
    every recheck that finds nothing new costs no request; the one that finds TrainingProgressing turned writes once.
    """
    clock = [datetime.datetime(2026, 12, 3, 10, 0, tzinfo=datetime.UTC)]
    monkeypatch.setattr("rlightning_operator._reconcile._now",
                        lambda: clock[0].strftime("%Y-%m-%dT%H:%M:%SZ"))
    reconciler.reconcile(group())
    revisions = {"currentRevision": "r1", "updateRevision": "r2" if rolling else "r1"}
    api.objects[("StatefulSet", NS, "cartpole-eval")]["status"] = {"replicas": 2, "readyReplicas": 2, **revisions}
    api.objects[("Job", NS, "cartpole-train")]["status"] = {"ready": 1, "active": 1}
    for key in (("Job", NS, "cartpole-train"), ("StatefulSet", NS, "cartpole-eval")):
        reconciler.cache.note_child(api.objects[key])

    def recheck(seconds):
        """Advance the clock, run the pass a recheck runs, deliver its write as the watch would; its requests."""
        clock[0] += datetime.timedelta(seconds=seconds)
        api.requests.clear()
        outcome = reconciler.refresh(NS, "cartpole", full=False)
        reconciler.cache.note_group(api.objects[(contract.KIND, NS, "cartpole")])
        return outcome, list(api.requests)

    outcome, requests = recheck(0)
    assert requests == ["patch/status"], "the trainers and evaluators became ready"
    progressing = {c["type"]: c for c in stored_status(api)["conditions"]}["TrainingProgressing"]
    assert progressing["reason"] == "Starting" and outcome.recheck_seconds is not None
    for _ in range(5):  # early rechecks (another condition's, a rollout's every 5 s) find nothing new
        outcome, requests = recheck(min(outcome.recheck_seconds, 5.0) if rolling else 1.0)
        assert requests == [] and outcome.recheck_seconds is not None
    outcome, requests = recheck(300)  # past the bound: the condition turns, once
    progressing = {c["type"]: c for c in stored_status(api)["conditions"]}["TrainingProgressing"]
    assert requests == ["patch/status"] and progressing["reason"] == "NotStarted"
    assert (outcome.recheck_seconds is not None) is rolling, "nothing else waits on time"
    for _ in range(5):
        outcome, requests = recheck(outcome.recheck_seconds or 600.0)
        assert requests == [], "a pass long after the condition turned writes nothing"


def test_what_is_kept_of_watched_objects_holds_no_managed_fields_or_annotations(api, reconciler):
    managed = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    annotations = {"rlightning.io/last-handled-configuration": '{"spec": {}}'}
    watched = group()
    watched["metadata"].update(managedFields=managed, annotations=annotations)
    reconciler.cache.note_group(watched)
    assert not {"managedFields", "annotations"} & set(reconciler.read_group(NS, "cartpole")["metadata"])
    api.objects[(contract.KIND, NS, "cartpole")]["metadata"].update(managedFields=managed, annotations=annotations)
    reconciler.reconcile(watched)  # its status write returns the object: kept until the watch delivers it
    kept = reconciler.read_group(NS, "cartpole")
    assert not {"managedFields", "annotations"} & set(kept["metadata"]) and kept["status"] == stored_status(api)


def relisting_memo(reconciler):
    """The handlers' shared state around `reconciler`, on the running loop; its refreshes wait an hour (never run)."""
    return _handlers.Context(OperatorSettings(), reconciler, Refresher(reconciler, delay=3600.0))


async def memo_closed(memo):
    """Cancel what the handlers scheduled on `memo`'s refresher."""
    assert memo.refresher is not None
    await memo.refresher.close()


def test_a_listing_after_the_pod_watch_was_down_tells_the_pods_deleted_meanwhile(monkeypatch, reconciler):
    # kopf lists again after 410 Gone or a failed stream: a pod deleted while the watch was down has no DELETED
    # event, only its absence from the listing (kopf marks listed objects with type None, then yields LISTED). kopf's
    # stream is replaced by that sequence: the API server answers 410 only once its watch cache has moved past the
    # watch's resourceVersion, which a test cannot bring about on demand
    trainer = trainer_pod("cartpole-train-0-abcde", 0, phase="Running")
    gone_before = trainer_pod("cartpole-train-0-fghij", 0, phase="Failed")  # its DELETED event comes
    starting = {"kind": "Pod", "metadata": {"name": "cartpole-eval-1", "namespace": NS, "labels": {
        contract.LABEL_GROUP: "cartpole", contract.LABEL_ROLE: "eval"}}, "status": {"phase": "Pending"}}
    down = asyncio.Event()

    async def stream(**_):
        for listed_pod in (trainer, starting, gone_before):
            yield {"type": None, "object": listed_pod}
        yield watching.Bookmark.LISTED
        yield {"type": "DELETED", "object": gone_before}
        yield {"type": None, "object": starting}  # listed again after the watch was down: the trainer is gone
        yield watching.Bookmark.LISTED
        await down.wait()

    listings, forgotten = [], []
    note_pod = reconciler.cache.note_pod

    def noted(pod, deleted=False):  # what the handlers tell the reconciler
        if deleted:
            forgotten.append(pod["metadata"]["name"])
        note_pod(pod, deleted)

    async def watch():
        memo = relisting_memo(reconciler)

        def listed(namespace, names):  # the operator's own handler, counted
            _handlers.pods_relisted(memo, namespace, names)
            listings.append((namespace, set(names)))

        task = asyncio.create_task(_watches.watch(
            kopf.OperatorSettings(), _watches.PODS, [NS], functools.partial(_handlers.pod_changed, memo), listed
        ))
        while len(listings) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await memo_closed(memo)

    monkeypatch.setattr(reconciler.cache, "note_pod", noted)
    monkeypatch.setattr(watching, "infinite_watch", stream)
    asyncio.run(asyncio.wait_for(watch(), 10))
    assert listings == [(NS, {(NS, "cartpole-train-0-abcde"), (NS, "cartpole-eval-1"), (NS, "cartpole-train-0-fghij")}),
                        (NS, {(NS, "cartpole-eval-1")})]
    # the pod whose DELETED event came, then the one gone from the listing; never one listed
    assert forgotten == ["cartpole-train-0-fghij", "cartpole-train-0-abcde"]
    assert reconciler.cache.pods_not_listed(None, set()) == [_pods.trim(starting)]  # the trainers are known gone


def test_a_listing_after_a_child_watch_was_down_tells_the_children_deleted_meanwhile(monkeypatch, reconciler):
    # As for pods: a Job deleted while its watch was down is known by its absence from the next listing; a Job of
    # another namespace, or a StatefulSet, is not judged by a listing of Jobs in this one.
    def child(kind, name, namespace=NS):
        labels = {contract.LABEL_GROUP: name.split("-")[0]}
        return {"kind": kind, "metadata": {"name": name, "namespace": namespace, "uid": name, "labels": labels},
                "spec": {}}

    kept, gone = child("Job", "cartpole-train"), child("Job", "pendulum-train")
    reconciler.cache.note_child(child("Job", "other-train", namespace="elsewhere"))
    reconciler.cache.note_child(child("StatefulSet", "cartpole-eval"))
    down = asyncio.Event()

    async def stream(**_):
        for listed_job in (kept, gone):
            yield {"type": None, "object": listed_job}
        yield watching.Bookmark.LISTED
        yield {"type": None, "object": kept}  # listed again after the watch was down: the pendulum Job is gone
        yield watching.Bookmark.LISTED
        await down.wait()

    forgotten, listings = [], []
    note_child = reconciler.cache.note_child

    def noted(child, deleted=False):  # what the handlers tell the reconciler
        if deleted:
            forgotten.append(child["metadata"]["name"])
        note_child(child, deleted)

    async def watch():
        memo = relisting_memo(reconciler)

        def listed(namespace, names):  # the operator's own handler, counted
            _handlers.children_relisted(memo, "Job", namespace, names)
            listings.append(namespace)

        task = asyncio.create_task(_watches.watch(
            kopf.OperatorSettings(), _watches.JOBS, [NS], functools.partial(_handlers.child_changed, memo, "Job"),
            listed,
        ))
        while len(listings) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await memo_closed(memo)

    monkeypatch.setattr(reconciler.cache, "note_child", noted)
    monkeypatch.setattr(watching, "infinite_watch", stream)
    asyncio.run(asyncio.wait_for(watch(), 10))
    assert forgotten == ["pendulum-train"]
    assert [job["metadata"]["name"] for job in reconciler.cache.children_not_listed("Job", None, set())] == [
        "other-train", "cartpole-train"
    ]
