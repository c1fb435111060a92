"""kopf handlers: thin adapters from kopf's callbacks to `Reconciler` and `Refresher`.

- create / update (of `spec` only) / resume of a PolicyGroup: one reconcile each. kopf keeps its progress
  and diff base in annotations under `rlightning.io/` (the CRD's status schema has no room for `status.kopf`,
  so bookkeeping there would be pruned and handlers would run again).
- events of the Jobs and StatefulSets the operator manages (server-side label selector), from the operator's own
  watches (`_watches`, started at the first PolicyGroup event, not kopf handlers: kopf would hold a queue and a
  worker per object, and the queues held every status event's whole body while the workers fell behind): a
  debounced reconcile of their PolicyGroup, so that status follows the pods and a deleted child comes back; events
  that change nothing the status or the plan reads (`_status.child_fingerprint`) are dropped. The reconciler keeps
  each child as last watched (`WatchCache.note_child`), so a status refresh reads none.
- events of their pods (same selector; read-only), from the same kind of watch: a debounced
  status refresh, so that status says when pods crash-loop, cannot be scheduled or hold a rollout
  (`_status.pod_fingerprint` drops the rest: a pod that only starts, a label or annotation); a refresh that
  finds a trainer pod failed or gone reconciles whole (a gang restart). The reconciler keeps from these events
  the pods the status reads (`_pods.trim`: every trainer pod, a gone one as the evidence of its loss, and the
  evaluators not ready), so no pass lists pods.
- events of the PolicyGroups themselves (their status included): kept by the reconciler as the body a pass
  starts from (`WatchCache.note_group`), and a status refresh only when the trainer's report
  of waiting for data and the DataFlowing condition disagree (`_status.data_condition_stale`), or the trainer
  reported after TrainingProgressing turned False (`_status.progress_condition_stale`); nothing else in a
  PolicyGroup's status changes without a child changing, except with time: a pass that leaves TrainingProgressing
  True asks for a recheck when it would turn False (`Refresher.recheck`).

There is no deletion handler and so no finalizer: children go with their owner through garbage collection.

What kopf keeps (docs/operator.md, "At scale"): no copy of any watched body (event handlers have no diff base;
only PolicyGroups get one, in an annotation); one small record per watched PolicyGroup, none per child or pod;
initial listings in pages of `LIST_CHUNK_SIZE`; an object's worker (with its last body) gone
`WORKER_IDLE_SECONDS` after its last event; at most `kopf_connection_limit` connections to the API server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import logging
import socket
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
from kopf._cogs.structs import references  # the watches' resource type (`_watches`)

from rlightning import contract
from rlightning_operator import _checkpoint_ask as checkpoint_ask
from rlightning_operator import _kube as kube
from rlightning_operator import _metrics as metrics
from rlightning_operator import _pods as pods
from rlightning_operator import _reconcile as reconcile
from rlightning_operator import _refresher as refresher
from rlightning_operator import _settings
from rlightning_operator import _status as status
from rlightning_operator import _watches as watches
from rlightning_operator import _watchlog as watchlog

logger = logging.getLogger(__name__)
REGISTRY = kopf.OperatorRegistry()
MANAGED_SELECTOR = f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY_VALUE}"
LIST_CHUNK_SIZE = 500
"""Objects per page of kopf's initial listings (`limit`/`continue`): at 11,000 pods one unpaged list is ~50 MB of
JSON parsed at once when the operator starts."""
WORKER_IDLE_SECONDS = 0.5
"""How long kopf keeps an object's worker (an asyncio task holding the object's last event, the whole body) after
its last event (`settings.queueing.idle_timeout`, kopf's default 5 s): with 5 s, 1000 evaluators starting within a
minute kept hundreds of pod bodies alive at once (peak RSS of `benchmarks/operator_scale.py --scenario wide` 119 MiB;
82 MiB with 0.5 s). A worker that exited is started again by the object's next event (kopf 1.45 handles every event
in turn: it has no batch window that a longer wait would fill)."""
API_RETRY_BACKOFFS_SECONDS = (1.0, *(2.0,) * 26)
"""Delays between kopf's attempts of a failed API request (`settings.networking.error_backoffs`), its watch and list
requests included: about as long in all (53 s) as kopf's default (1, 1, 2, 3, 5, 8, 13, 21: 54 s) before a request
gives up, but never more than 2 s apart. With the default, an API server down 35 s was asked again 54 s after it
went, so each watch came back up to 21 s after the API server did; now within 2 s."""
WATCHED_KINDS = 4
"""Kinds watched on kopf's session (PolicyGroups by kopf; Jobs, StatefulSets and pods by `_watches`): one long-lived
watch connection each per served namespace (one each when cluster-wide); Nodes add one cluster-wide watch."""
NODES = references.Resource(group="", version="v1", plural="nodes", kind="Node", namespaced=False)
"""Watched cluster-wide (nodes have no namespace); `node_changed` keeps only those that trainer pods run on."""


def kopf_connection_limit(settings: _settings.OperatorSettings) -> int:
    """Connections kopf may hold to the API server: its watches, plus `settings.workers` for its short requests
    (annotation patches of PolicyGroups, Events).

    kopf's own session has no limit, and kopf patches each PolicyGroup's annotations from its worker and posts each
    object's Events from a worker of their own, all at once: a burst of PolicyGroups opened one connection per
    concurrent request and kept each in the pool for aiohttp's keep-alive (15 s), with its TLS read buffer (asyncio's
    `SSLProtocol`) and OpenSSL's state: 60 connections and 7.5 MiB of read buffers (tracemalloc) for 100
    PolicyGroups created at once (`benchmarks/operator_scale.py --scenario many`), up to one per group for more.

    Args:
        settings (_settings.OperatorSettings): The operator's settings (namespaces, workers).

    Returns:
        int: The limit, at least one more than the watches, so a short request never waits for a watch to end.
    """
    namespaces = 1 if settings.all_namespaces else len(settings.served_namespaces)
    return WATCHED_KINDS * namespaces + 1 + settings.workers


@dataclasses.dataclass
class Context:
    """What the handlers share, passed to kopf as the operator's memo.

    Attributes:
        settings (_settings.OperatorSettings): The operator's settings.
        reconciler (reconcile.Reconciler): Does the work.
        refresher (refresher.Refresher | None): Debounces child-triggered reconciles; made at startup (it
            needs the running event loop).
        kopf_settings (kopf.OperatorSettings | None): kopf's settings as configured at startup (the watches read
            their timeouts, page size and label selectors).
        watches (list[asyncio.Task[None]]): The watches of pods, Jobs and StatefulSets (`_watches.watch`) once
            started by the first PolicyGroup event (`group_changed`; so only by a leader), cancelled at cleanup. A
            list, made before kopf starts: kopf gives each object's handlers a shallow copy of the memo, and this
            must be shared.
        client (kube.KubeClient | None): The API, for the checkpoint requests of `node_changed`; None: none are made.
        watch_log (watchlog.StreamLog): Logs each watch stream's losses, reconnects and listings (every session
            kopf makes in `login` traces its requests to it).
    """

    settings: _settings.OperatorSettings
    reconciler: reconcile.Reconciler
    refresher: refresher.Refresher | None = None
    kopf_settings: kopf.OperatorSettings | None = None
    watches: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)
    client: kube.KubeClient | None = None
    watch_log: watchlog.StreamLog = dataclasses.field(default_factory=watchlog.StreamLog)


def post_event(obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """Post a Kubernetes Event about `obj` through kopf (queued; safe from handler threads)."""
    kopf.event(dict(obj), type=type_, reason=reason, message=message)  # type: ignore[arg-type]  # reads any mapping


@kopf.on.startup(registry=REGISTRY)
async def configure(settings: kopf.OperatorSettings, memo: Context, **_: Any) -> None:
    """Point kopf's bookkeeping at annotations, name the event source, filter child watches server-side; start
    the refresher.
    """
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=contract.API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=contract.API_GROUP, key="last-handled-configuration"
    )
    settings.posting.reporting_component = contract.MANAGED_BY_VALUE
    settings.posting.reporting_instance = socket.gethostname()
    settings.execution.max_workers = memo.settings.workers
    settings.peering.standalone = True
    # The operator serves named namespaces (or all) and one CRD that exists before it starts (Helm installs
    # crds/ first), so it needs no list/watch of Namespaces and CRDs; the chart grants neither, and with
    # scanning on kopf retries those forbidden listings for about a minute before it serves anything.
    settings.scanning.disabled = True
    # Every watch ends server-side after watch_server_timeout_seconds and is cut client-side after
    # watch_client_timeout_seconds, so a connection dropped without a reset cannot leave a watch quiet for long;
    # short requests (patches, Events) are bounded like the reconciler's.
    settings.watching.server_timeout = memo.settings.watch_server_timeout_seconds
    settings.watching.client_timeout = memo.settings.watch_client_timeout_seconds
    settings.watching.connect_timeout = memo.settings.api_timeout_seconds
    settings.watching.chunk_size = LIST_CHUNK_SIZE
    settings.queueing.idle_timeout = WORKER_IDLE_SECONDS
    settings.networking.request_timeout = memo.settings.api_timeout_seconds
    settings.networking.error_backoffs = API_RETRY_BACKOFFS_SECONDS
    settings.watching.label_selectors["batch", "jobs"] = MANAGED_SELECTOR
    settings.watching.label_selectors["apps", "statefulsets"] = MANAGED_SELECTOR
    settings.watching.label_selectors["v1", "pods"] = MANAGED_SELECTOR
    memo.kopf_settings = settings
    memo.refresher = refresher.Refresher(
        memo.reconciler,
        delay=memo.settings.refresh_delay_seconds,
        interval=memo.settings.pass_interval_seconds,
        executor=concurrent.futures.ThreadPoolExecutor(memo.settings.workers, thread_name_prefix="refresh"),
    )


@kopf.on.login(registry=REGISTRY)
async def login(memo: Context, **kwargs: Any) -> kopf.AiohttpSession | None:
    """kopf's credentials: the in-cluster service account, else $KUBECONFIG read now (a custom registry gets
    no default login handler), in a session of kopf's own making but with at most `kopf_connection_limit`
    connections (kopf closes it when the credentials are replaced), its requests traced by `Context.watch_log`.
    """
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is None:
        return None
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=kopf_connection_limit(memo.settings), ssl=info.as_ssl_context()),
        headers=info.as_http_headers(), proxy=info.proxy_url, trust_env=info.trust_env,
        trace_configs=[memo.watch_log.trace_config()],
    )
    return kopf.AiohttpSession(aiohttp_session=session, server=info.server, priority=info.priority,
                               default_namespace=info.default_namespace, expiration=info.expiration)


@kopf.on.cleanup(registry=REGISTRY)
async def cleanup(memo: Context, **_: Any) -> None:
    """Stop the watches and cancel pending refreshes."""
    for task in memo.watches:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if memo.refresher is not None:
        await memo.refresher.close()


@kopf.on.resume(contract.API_GROUP, contract.API_VERSION, contract.PLURAL, id="reconcile-resume", param="resume",
                registry=REGISTRY)
@kopf.on.create(contract.API_GROUP, contract.API_VERSION, contract.PLURAL, id="reconcile-create", param="create",
                registry=REGISTRY)
# The ignore: kopf's handler protocol gives `param` a default, and each of these decorators sets it.
@kopf.on.update(contract.API_GROUP, contract.API_VERSION, contract.PLURAL,  # type: ignore[arg-type]
                id="reconcile-update", param="update", field="spec", registry=REGISTRY)
def reconcile_group(body: kopf.Body, param: str, retry: int, memo: Context, **_: Any) -> None:
    """Reconcile a PolicyGroup after it was created, its spec changed, or the operator started.

    Raises:
        kopf.PermanentError: The spec is invalid (status and a Warning Event name the field); no retry.
        kopf.TemporaryError: The API failed, or a child is being deleted or belongs to another owner; kopf
            retries with backoff.
    """
    metrics.RECONCILES.labels(trigger=param).inc()
    try:
        outcome = memo.reconciler.reconcile(_plain(body))
    except reconcile.InvalidSpecError as error:
        metrics.RECONCILE_ERRORS.labels(trigger=param, error="invalid").inc()
        raise kopf.PermanentError(f"invalid spec: {error}") from None
    except kube.ApiError as error:
        transient = isinstance(error, kube.TransientApiError)
        metrics.RECONCILE_ERRORS.labels(trigger=param, error="transient" if transient else "permanent").inc()
        # A refusal (Forbidden, Invalid) may be fixed by an administrator: retry it too, with the same backoff
        # (the Reconciler has reported it in status and with a Warning Event).
        raise kopf.TemporaryError(str(error), delay=_settings.retry_delay(retry)) from None
    except Exception:
        metrics.RECONCILE_ERRORS.labels(trigger=param, error="unexpected").inc()
        raise
    if outcome.recheck_seconds is not None and memo.refresher is not None:
        memo.refresher.recheck(body.metadata.namespace or "", body.metadata.name or "", outcome.recheck_seconds)
    if outcome.blocked:  # nothing else may wake us when they are gone: look again later
        raise kopf.TemporaryError(f"waiting for {', '.join(outcome.blocked)}", delay=_settings.retry_delay(retry))


def child_changed(memo: Context, kind: str, child: dict[str, Any], deleted: bool) -> None:
    """A managed Job or StatefulSet changed (status, spec, deletion): refresh its PolicyGroup soon, unless
    nothing the status or the plan reads from it changed.

    Args:
        memo (Context): The operator's shared state.
        kind (str): `Job` or `StatefulSet` (a watch event's object may carry no `kind`).
        child (dict[str, Any]): The child as its watch (`_watches`) hands it.
        deleted (bool): It is gone (a DELETED event).
    """
    child = {**child, "kind": kind}
    metadata = child.get("metadata") or {}
    group, namespace = (metadata.get("labels") or {}).get(contract.LABEL_GROUP), metadata.get("namespace")
    if group and memo.refresher is not None and namespace:
        memo.reconciler.cache.note_child(child, deleted=deleted)  # a status refresh reads no child
        scheduled = memo.refresher.notify(namespace, group, metadata.get("uid") or "", status.child_fingerprint(child),
                                          deleted=deleted)
        metrics.WATCH_EVENTS.labels(kind=kind, outcome="pass" if scheduled else "ignored").inc()


def children_relisted(memo: Context, kind: str, namespace: str | None, listed: set[tuple[str, str]]) -> None:
    """A complete listing of the `kind` children of `namespace` (None: every namespace): each one the reconciler keeps
    that it does not hold was deleted while the watch was down (no DELETED event came), and is handled as deleted.

    Args:
        memo (Context): The operator's shared state.
        kind (str): `Job` or `StatefulSet`.
        namespace (str | None): The namespace listed; None for every namespace.
        listed (set[tuple[str, str]]): (namespace, name) of every child listed.
    """
    for child in memo.reconciler.cache.children_not_listed(kind, namespace, listed):
        logger.info("%s %s/%s was deleted while its watch was down", kind, child["metadata"].get("namespace"),
                    child["metadata"].get("name"))
        child_changed(memo, kind, child, deleted=True)


def pod_changed(memo: Context, pod: dict[str, Any], deleted: bool) -> None:
    """A pod of a managed Job or StatefulSet changed (crash loop, scheduling, readiness): refresh its PolicyGroup's
    status soon, unless nothing `_pods` reads from it changed. Pods are only read, never written.

    Args:
        memo (Context): The operator's shared state.
        pod (dict[str, Any]): The pod as its watch (`_watches`) hands it, or as the reconciler kept it
            (`_pods.trim`med: trimming again changes nothing).
        deleted (bool): It is gone (a DELETED event).
    """
    pod = pods.trim(pod)  # at once: nothing else of the event is kept
    metadata = pod["metadata"]
    group, namespace = (metadata.get("labels") or {}).get(contract.LABEL_GROUP), metadata.get("namespace")
    if group and memo.refresher is not None and namespace:
        memo.reconciler.cache.note_pod(pod, deleted=deleted)  # what the status reads: no pass lists pods
        memo.reconciler.node_notices.note_pod(pod, deleted, time.time())
        scheduled = memo.refresher.notify(namespace, group, metadata.get("uid") or "", status.pod_fingerprint(pod),
                                          deleted=deleted, child=False, unseen=status.QUIET_POD)
        metrics.WATCH_EVENTS.labels(kind="Pod", outcome="pass" if scheduled else "ignored").inc()


@kopf.on.event(contract.API_GROUP, contract.API_VERSION, contract.PLURAL, registry=REGISTRY)
async def group_changed(body: kopf.Body, type: str | None, memo: Context, **_: Any) -> None:  # noqa: A002 (kopf's)
    """A PolicyGroup changed, its status included: refresh its status soon when the trainer's report of waiting for
    data (status.training) and the DataFlowing condition disagree, or when a report arrived after
    TrainingProgressing turned False. Spec changes have handlers of their own. The first event starts the watches of
    pods, Jobs and StatefulSets.
    """
    if not memo.watches:
        _start_watches(memo)
    namespace, name, group = body.metadata.namespace, body.metadata.name, _plain(body)
    memo.reconciler.cache.note_group(group, deleted=type == "DELETED")  # a refresh reads no PolicyGroup
    stale = memo.refresher is not None and namespace and name and not body.metadata.get("deletionTimestamp") and \
        (status.data_condition_stale(group) or status.progress_condition_stale(group))
    if stale and memo.refresher is not None and namespace and name:
        memo.refresher.schedule(namespace, name, full=False)
    metrics.WATCH_EVENTS.labels(kind=contract.KIND, outcome="pass" if stale else "ignored").inc()


def pods_relisted(memo: Context, namespace: str | None, listed: set[tuple[str, str]]) -> None:
    """A complete listing of the pods of `namespace` (None: every namespace): each pod the reconciler keeps that it
    does not hold was deleted while the pod watch was down (no DELETED event came), and is handled as deleted.

    Args:
        memo (Context): The operator's shared state.
        namespace (str | None): The namespace listed; None for every namespace.
        listed (set[tuple[str, str]]): (namespace, name) of every pod listed.
    """
    for pod in memo.reconciler.cache.pods_not_listed(namespace, listed):
        logger.info("pod %s/%s was deleted while the pod watch was down", pod["metadata"].get("namespace"),
                    pod["metadata"].get("name"))
        pod_changed(memo, pod, deleted=True)


def node_changed(memo: Context, node: dict[str, Any], deleted: bool) -> None:
    """A node changed: when one that trainer pods run on is newly marked for disruption (`_notices`), ask each of
    their PolicyGroups for a checkpoint now (`_checkpoint_ask`, in a thread: it writes to the API).

    Args:
        memo (Context): The operator's shared state.
        node (dict[str, Any]): The Node as its watch hands it.
        deleted (bool): It is gone.
    """
    for ask in memo.reconciler.node_notices.note_node(node, deleted, time.time()):
        if memo.client is not None:
            call = functools.partial(contextvars.copy_context().run, checkpoint_ask.request_checkpoint, memo.client,
                                     post_event, ask, time.time())
            asyncio.get_running_loop().run_in_executor(None, call)


def _start_watches(memo: Context) -> None:
    """Start the watches of pods, Jobs and StatefulSets in the context of a kopf event handler, which their tasks copy:
    kopf's credentials (the watches run on kopf's session) and kopf's Event queue, which `kopf.event` needs in the
    passes the watches schedule and which kopf sets only for its object handlers. Before the first PolicyGroup there
    are no children to watch.
    """
    namespaces = None if memo.settings.all_namespaces else memo.settings.served_namespaces
    assert memo.kopf_settings is not None, "set at startup, before any event"
    settings = memo.kopf_settings
    memo.watches.append(asyncio.create_task(watches.watch(
        settings, watches.PODS, namespaces, functools.partial(pod_changed, memo), functools.partial(pods_relisted, memo)
    )))
    for resource, kind in ((watches.JOBS, "Job"), (watches.STATEFULSETS, "StatefulSet")):
        handle = functools.partial(child_changed, memo, kind)
        listed = functools.partial(children_relisted, memo, kind)
        memo.watches.append(asyncio.create_task(watches.watch(settings, resource, namespaces, handle, listed)))
    memo.watches.append(asyncio.create_task(watches.watch(
        # a node deleted while the watch was down needs nothing: its notice is kept (`_notices.KEEP_SECONDS`)
        settings, NODES, None, functools.partial(node_changed, memo), lambda namespace, listed: None)))


def _plain(body: kopf.Body) -> dict[str, Any]:
    """kopf's read-only body view as a plain dict."""
    return {key: body[key] for key in body}
