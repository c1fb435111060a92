{{/*
The RBAC rules of the operator, the same for the ClusterRole (all namespaces) and for each namespace's Role.
Only what rlightning_operator calls (its docstring lists the same table; nodes, cluster-scoped, are in
rbac-nodes.yaml) and what kopf does on its behalf; no Secrets, on pods reading and the forced deletion of one stranded on a lost node, no wildcards. kopf runs standalone, so no peering objects (leader
election uses one Lease in the release namespace, granted by leader-election.yaml); it finds the PolicyGroup
resource through API discovery, which every authenticated user may read (system:discovery), and is given no
access to CustomResourceDefinitions or Namespaces (cluster-scoped, so a per-namespace install could not grant
them anyway): the operator sets kopf's `settings.scanning.disabled`, so it asks for neither and serves the CRD
present at start-up (Helm installs crds/ before the Deployment).
*/}}
{{- define "rlightning-operator.rules" -}}
# kopf lists and watches PolicyGroups; it patches them with its progress and diff-base annotations.
# `get`: the operator reads a PolicyGroup afresh before a child-triggered reconcile.
- apiGroups: ["rlightning.io"]
  resources: ["policygroups"]
  verbs: ["get", "list", "watch", "patch"]
# The operator writes status (phase, conditions, replicas). The per-group Role it creates for trainer pods
# grants get and patch on it, and RBAC only lets the operator grant what it holds.
- apiGroups: ["rlightning.io"]
  resources: ["policygroups/status"]
  verbs: ["get", "patch"]
# Owner references with blockOwnerDeletion on children need update on the owner's finalizers subresource
# where the OwnerReferencesPermissionEnforcement admission plugin is on.
- apiGroups: ["rlightning.io"]
  resources: ["policygroups/finalizers"]
  verbs: ["update"]
# Children made once per PolicyGroup: the spec ConfigMap, the trainer and evaluator Services, and the pods'
# ServiceAccount, Role and RoleBinding. Read by name, created, patched on a spec change; deleted only by
# garbage collection through their owner reference.
- apiGroups: [""]
  resources: ["configmaps", "serviceaccounts"]
  verbs: ["get", "create", "patch"]
# `delete`: a Service found with a cluster IP where a headless one is wanted (clusterIP is immutable) is recreated.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch"]
# Trainers: kopf watches managed Jobs to follow their status; a template change deletes and recreates the Job.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Evaluators: kopf watches managed StatefulSets; the operator patches replicas and template in place.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The trainers' and evaluators' PodDisruptionBudgets: created, patched when spec.eval.disruptionBudget or
# spec.train.nodes changes; deleted only by garbage collection.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
{{- if .Values.networkPolicy.enabled }}
# The trainers' NetworkPolicy of each PolicyGroup (`networkPolicy.enabled`): created, patched when the spec's
# metrics port changes; deleted only by garbage collection.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch"]
{{- end }}
# Pods of the managed Jobs and StatefulSets: status says when they crash-loop, cannot be scheduled or hold a
# rollout (kopf watches them with the managed-by label selector; the operator lists a group's pods). `delete`: a
# pod the taint manager evicted from a node that stopped answering is force-deleted once its grace period is over
# (an evaluator, or a trainer of an older attempt), or it would hold the run until the node came back.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
# Events about PolicyGroups (kopf posts core/v1 Events, create only).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
