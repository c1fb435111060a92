"""The PolicyGroup operator (kopf): PolicyGroup -> ConfigMap, RBAC, disruption budgets, the trainers'
NetworkPolicy, trainer Job, evaluator StatefulSet, status.

What belongs here: pure builders (`_builders`), the pure planner (`_planner`) and status function
(`_status`, with the pods' diagnosis `_pods`), the one module that calls the API (`_kube`), the reconcile
that ties them (`_reconcile`), thin kopf handlers (`_handlers`, `_refresher`), the watches of pods, Jobs and
StatefulSets (`_watches`, on kopf's watch stream), leader election over a Lease (`_leader`), the liveness endpoint
(`_health`), node disruption notices and restart reasons (`_disruption`, pure; `_notices`, the watched nodes' notices;
`_checkpoint_ask`, a checkpoint asked of the trainers on notice), settings, metrics and the `rlightning-operator`
entry point.
From `rlightning` it imports only `rlightning.config`, `rlightning.contract` and `rlightning.launch` (no torch).
Design notes and the user's flow: docs/operator.md.

RBAC the operator needs (Role per served namespace, or ClusterRole with --all-namespaces):

======================================  ==========================================  ===============================
API group / resource                    verbs                                       why
======================================  ==========================================  ===============================
rlightning.io policygroups              get, list, watch, patch                     kopf watches; kopf's progress
                                                                                    and diff-base annotations
rlightning.io policygroups/status       get, patch                                  status writes; `get` also lets
                                                                                    it grant the same in the
                                                                                    per-group Role (no escalation)
rlightning.io policygroups/finalizers   update                                      owner references with
                                                                                    blockOwnerDeletion (admission
                                                                                    OwnerReferencesPermission-
                                                                                    Enforcement)
"" configmaps                           get, create, patch                          the spec ConfigMap
"" services                             get, create, patch, delete                  trainer and evaluator Services
                                                                                    (a non-headless one is
                                                                                    recreated: clusterIP is
                                                                                    immutable)
"" serviceaccounts                      get, create, patch                          the pods' ServiceAccount
rbac.authorization.k8s.io roles         get, create, patch                          the pods' Role
rbac.authorization.k8s.io rolebindings  get, create, patch                          the pods' RoleBinding
batch jobs                              get, list, watch, create, patch, delete     trainers (recreated on a
                                                                                    template change and for each
                                                                                    attempt of the gang)
apps statefulsets                       get, list, watch, create, patch             evaluators
policy poddisruptionbudgets             get, create, patch                          trainers' and evaluators'
                                                                                    disruption budgets
networking.k8s.io networkpolicies      get, create, patch                          the trainers' NetworkPolicy
                                                                                    (only with the setting
                                                                                    network_policy on)
"" pods                                 get, list, watch, delete                    status: crash loops,
                                                                                    unschedulable pods, stuck
                                                                                    rollouts, trainers lost;
                                                                                    delete: a pod stranded on a
                                                                                    node that stopped answering
"" events                               create                                      Events (kopf posts core/v1)
coordination.k8s.io leases              create; get, update (one name)              leader election, in the
                                                                                    Lease's namespace only
"" nodes (ClusterRole in either mode)   get, list, watch                            disruption notices of the
                                                                                    trainers' nodes (`_notices`)
======================================  ==========================================  ===============================

Nothing on secrets, namespaces or CRDs; nodes only read; on pods, reading and one forced deletion: kopf's scanning
is off, so it serves the PolicyGroup CRD present at start. kopf runs standalone (no peering objects): with
--leader-elect the process starts kopf only while it holds the Lease.
"""

from rlightning_operator._builders import build_children, owner_reference, with_owner
from rlightning_operator._planner import Action, plan
from rlightning_operator._settings import OperatorSettings
from rlightning_operator._status import Observation, compute_status

__all__ = [
    "Action",
    "Observation",
    "OperatorSettings",
    "build_children",
    "compute_status",
    "owner_reference",
    "plan",
    "with_owner",
]
