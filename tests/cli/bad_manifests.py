"""One corpus of manifests, most of them broken, that `rlightning validate` and the API server must judge alike.

Each `Case` is a whole file (bytes, as a user would save it): the example `examples/cartpole.yaml` with one
mistake, or a file that is not a manifest at all. `field` is the field path the CLI's `error:` line names (None
for a good manifest). A case the API server cannot judge, because only the CLI's deep checks see it (the gymnasium
registry, the policy class's import, its kwargs model, the env's spaces), carries `cli_only`, the reason; the
server accepts those, the CLI refuses them. Every other case gets the same verdict from both
(tests/cli/test_corpus.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from tests.operator.operator_cluster import example

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole.yaml"


@dataclasses.dataclass(frozen=True)
class Case:
    """One manifest file and the verdict both validators must give it.

    Attributes:
        name (str): What is wrong (or right) with it.
        content (bytes): The file.
        field (str | None): The field path the CLI names; None: a good manifest, accepted by both.
        cli_only (str): Why only the CLI refuses it (the API server accepts it); empty: both judge it.
    """

    name: str
    content: bytes
    field: str | None
    cli_only: str = ""

    @property
    def good(self) -> bool:
        """Whether both must accept it."""
        return self.field is None


def edited(**paths: Any) -> bytes:
    """The example with `paths` (dotted camelCase paths; None removes the key) set, as a YAML file."""
    return yaml.safe_dump(example(**paths), sort_keys=False).encode()


def bad(name: str, field: str, **paths: Any) -> Case:
    """A case both refuse, naming `field`."""
    return Case(name, edited(**paths), field)


def good(name: str, **paths: Any) -> Case:
    """A case both accept."""
    return Case(name, edited(**paths), None)


def _text(text: str) -> bytes:
    return text.encode()


def _replace(old: str, new: str) -> bytes:
    """The example's own text with one plain scalar written differently (as a user would type it, unquoted)."""
    assert old in _EXAMPLE_TEXT, old
    return _EXAMPLE_TEXT.replace(old, new, 1).encode()


def _runtime(role: str, **fields: Any) -> dict[str, Any]:
    """A pod template whose runtime container (named after the role) sets `fields`."""
    return {"spec": {"containers": [{"name": role, **fields}]}}


_EXAMPLE_TEXT = EXAMPLE.read_text()
_GPU = "nvidia.com/gpu"

CASES: list[Case] = [
    # -- types: no coercion the CRD's schema would refuse -----------------------------------------------------------
    bad("integer given as a string", "spec.env.numEnvs", **{"spec.env.numEnvs": "4"}),
    bad("integer given as a boolean", "spec.env.numEnvs", **{"spec.env.numEnvs": True}),
    bad("integer given a fraction", "spec.env.numEnvs", **{"spec.env.numEnvs": 2.5}),
    bad("replicas as a string", "spec.eval.replicas", **{"spec.eval.replicas": "2"}),
    bad("nodes as a string", "spec.train.nodes", **{"spec.train.nodes": "1"}),
    bad("number given as a string", "spec.policy.optim.lr", **{"spec.policy.optim.lr": "0.001"}),
    bad("number given as a boolean", "spec.policy.optim.lr", **{"spec.policy.optim.lr": True}),
    bad("boolean given as a string", "spec.train.checkpoint.resume", **{"spec.train.checkpoint.resume": "yes"}),
    bad("boolean given as an integer", "spec.eval.deterministic", **{"spec.eval.deterministic": 1}),
    bad("string given as an integer", "spec.image", **{"spec.image": 123}),
    bad("env id given as an integer", "spec.env.id", **{"spec.env.id": 42}),
    bad("policy class given as a boolean", "spec.policy.policyClass", **{"spec.policy.policyClass": True}),
    bad("env kwargs not an object", "spec.env.kwargs", **{"spec.env.kwargs": "render"}),
    bad("policy kwargs not an object", "spec.policy.policyKwargs", **{"spec.policy.policyKwargs": [1, 2]}),
    bad("tolerations not a list", "spec.train.pod.tolerations", **{"spec.train.pod.tolerations": "none"}),
    bad("a toleration not an object", "spec.train.pod.tolerations[0]", **{"spec.train.pod.tolerations": [1]}),
    bad("node selector value not a string", "spec.eval.pod.nodeSelector.pool",
        **{"spec.eval.pod.nodeSelector": {"pool": 1}}),
    bad("cpu request as a number", "spec.train.pod.resources.requests.cpu",
        **{"spec.train.pod.resources.requests.cpu": 2}),
    bad("disruption budget as a numeric string", "spec.eval.disruptionBudget.maxUnavailable",
        **{"spec.eval.disruptionBudget": {"maxUnavailable": "4"}}),
    bad("disruption budget as a boolean", "spec.eval.disruptionBudget.maxUnavailable",
        **{"spec.eval.disruptionBudget": {"maxUnavailable": True}}),
    bad("disruption budget a fraction", "spec.eval.disruptionBudget.maxUnavailable",
        **{"spec.eval.disruptionBudget": {"maxUnavailable": 1.5}}),
    bad("port as a string", "spec.ports.metrics", **{"spec.ports": {"metrics": "9400"}}),
    bad("timeout as a string", "spec.weightSync.timeoutSeconds", **{"spec.weightSync.timeoutSeconds": "60"}),
    bad("target return as a word", "spec.train.targetEvalReturn", **{"spec.train.targetEvalReturn": "high"}),
    bad("env as a string", "spec.env", **{"spec.env": "CartPole-v1"}),
    bad("train as a list", "spec.train", **{"spec.train": []}),
    Case("a bare y is a boolean, not a string", _replace("numEnvs: 4", "numEnvs: 4\n  image: y"),
         "spec.image"),
    Case("1e3 is a number, not a string", _replace("id: CartPole-v1", "id: 1e3"), "spec.env.id"),
    Case("an infinite number", _replace("gamma: 0.98", "gamma: .inf"), "spec.policy.policyKwargs.gamma"),
    # -- bounds -------------------------------------------------------------------------------------------------
    bad("negative replicas", "spec.eval.replicas", **{"spec.eval.replicas": -1}),
    bad("zero trainer nodes", "spec.train.nodes", **{"spec.train.nodes": 0}),
    bad("too many ranks per node", "spec.train.procsPerNode", **{"spec.train.procsPerNode": 65}),
    bad("zero env copies", "spec.env.numEnvs", **{"spec.env.numEnvs": 0}),
    bad("too many env copies", "spec.env.numEnvs", **{"spec.env.numEnvs": 5000}),
    bad("zero learning rate", "spec.policy.optim.lr", **{"spec.policy.optim.lr": 0}),
    bad("negative learning rate", "spec.policy.optim.lr", **{"spec.policy.optim.lr": -0.1}),
    bad("zero sync timeout", "spec.weightSync.timeoutSeconds", **{"spec.weightSync.timeoutSeconds": 0}),
    bad("sync timeout above an hour", "spec.weightSync.timeoutSeconds", **{"spec.weightSync.timeoutSeconds": 4000}),
    bad("bucket below 1 KiB", "spec.weightSync.bucketSizeBytes", **{"spec.weightSync.bucketSizeBytes": 100}),
    bad("port above 65535", "spec.ports.torchrun", **{"spec.ports": {"torchrun": 70000}}),
    bad("negative metrics port", "spec.ports.metrics", **{"spec.ports": {"metrics": -1}}),
    bad("zero episode limit", "spec.env.maxEpisodeSteps", **{"spec.env.maxEpisodeSteps": 0}),
    bad("negative seed", "spec.train.seed", **{"spec.train.seed": -1}),
    bad("negative evaluation interval", "spec.eval.evaluationIntervalSeconds",
        **{"spec.eval.evaluationIntervalSeconds": -1}),
    bad("percentage above 100", "spec.eval.disruptionBudget.maxUnavailable",
        **{"spec.eval.disruptionBudget": {"maxUnavailable": "101%"}}),
    bad("negative disruption budget", "spec.eval.disruptionBudget.minAvailable",
        **{"spec.eval.disruptionBudget": {"minAvailable": -1}}),
    # -- enums and patterns ---------------------------------------------------------------------------------------
    bad("unknown pull policy", "spec.imagePullPolicy", **{"spec.imagePullPolicy": "Sometimes"}),
    bad("unknown optimizer", "spec.policy.optim.name", **{"spec.policy.optim.name": "rmsprop"}),
    bad("unknown sync backend", "spec.weightSync.backend", **{"spec.weightSync.backend": "mpi"}),
    bad("unknown sync dtype", "spec.weightSync.dtype", **{"spec.weightSync.dtype": "int8"}),
    bad("unknown after-training action", "spec.eval.afterTraining", **{"spec.eval.afterTraining": "Pause"}),
    bad("unknown rollout mode", "spec.policy.rolloutMode", **{"spec.policy.rolloutMode": "parallel"}),
    bad("unknown data source", "spec.train.dataSource", **{"spec.train.dataSource": "both"}),
    bad("policy class not an import path", "spec.policy.policyClass", **{"spec.policy.policyClass": "not a path"}),
    bad("empty env id", "spec.env.id", **{"spec.env.id": ""}),
    bad("claim name not a DNS subdomain", "spec.train.checkpoint.persistentVolumeClaim",
        **{"spec.train.checkpoint.persistentVolumeClaim": "Bad_Claim"}),
    bad("priority class in capitals", "spec.eval.pod.priorityClassName",
        **{"spec.eval.pod.priorityClassName": "HIGH"}),
    bad("cpu not a quantity", "spec.train.pod.resources.requests.cpu",
        **{"spec.train.pod.resources.requests.cpu": "two"}),
    bad("quantity too long", "spec.train.pod.resources.limits.cpu",
        **{"spec.train.pod.resources.limits.cpu": "1" * 65}),
    # -- unknown fields (kubectl's strict field validation) ------------------------------------------------------
    bad("unknown spec field", "spec.bogus", **{"spec.bogus": 1}),
    bad("unknown nested field", "spec.train.gpus", **{"spec.train.gpus": 1}),
    bad("unknown top-level field", "replicas", replicas=2),
    bad("unknown metadata field", "metadata.owner", **{"metadata.owner": "me"}),
    # -- cross-field rules (CEL in the CRD, model validators in the CLI) ---------------------------------------
    bad("replicas above max", "spec.eval.replicas", **{"spec.eval.replicas": 5, "spec.eval.maxReplicas": 3}),
    bad("replicas below min", "spec.eval.replicas", **{"spec.eval.replicas": 1, "spec.eval.minReplicas": 2}),
    bad("clashing ports", "spec.ports", **{"spec.ports": {"torchrun": 29600, "weightSync": 29600}}),
    bad("memory request above its limit", "spec.train.pod.resources.requests.memory",
        **{"spec.train.pod.resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}),
    bad("gpu request differs from its limit", f"spec.train.pod.resources.requests.{_GPU}",
        **{"spec.train.pod.resources": {"requests": {_GPU: "1"}, "limits": {_GPU: "2"}}}),
    bad("both disruption budget fields", "spec.eval.disruptionBudget",
        **{"spec.eval.disruptionBudget": {"maxUnavailable": 1, "minAvailable": 1}}),
    bad("neither disruption budget field", "spec.eval.disruptionBudget", **{"spec.eval.disruptionBudget": {}}),
    bad("intake ports over the torchrun port", "spec.ports.trajectories",
        **{"spec.ports": {"torchrun": 29500, "trajectories": 29499}, "spec.train.procsPerNode": 2}),
    bad("intake ports past 65535", "spec.ports.trajectories",
        **{"spec.ports": {"trajectories": 65535}, "spec.train.procsPerNode": 2}),
    bad("rollout workers in sync mode", "spec.eval.rolloutWorkers", **{"spec.eval.rolloutWorkers": 2}),
    bad("more rollout workers than env copies", "spec.eval.rolloutWorkers",
        **{"spec.policy.rolloutMode": "async", "spec.eval.rolloutWorkers": 9}),
    # -- pod templates: what the operator owns, GPUs, /dev/shm, NCCL settings -------------------------------------
    bad("template sets the runtime's command", "template.spec.containers.train.command",
        **{"spec.train.template": _runtime("train", command=["sleep", "1"])}),
    bad("template sets the runtime's image", "template.spec.containers.eval.image",
        **{"spec.eval.template": _runtime("eval", image="mine:1")}),
    bad("template sets the runtime's pull policy", "template.spec.containers.train.imagePullPolicy",
        **{"spec.train.template": _runtime("train", imagePullPolicy="Always")}),
    bad("template sets the runtime's probe", "template.spec.containers.eval.livenessProbe",
        **{"spec.eval.template": _runtime("eval", livenessProbe={"exec": {"command": ["true"]}})}),
    bad("template sets the runtime's resources", "template.spec.containers.train.resources",
        **{"spec.train.template": _runtime("train", resources={"limits": {"cpu": "1"}})}),
    bad("template sets a runtime variable", "template.spec.containers.train.env.RLIGHTNING_ROLE",
        **{"spec.train.template": _runtime("train", env=[{"name": "RLIGHTNING_ROLE", "value": "eval"}])}),
    bad("template sets an NCCL variable", "spec.nccl",
        **{"spec.eval.template": _runtime("eval", env=[{"name": "NCCL_DEBUG", "value": "INFO"}])}),
    bad("template sets the thread count", "template.spec.containers.eval.env.OMP_NUM_THREADS",
        **{"spec.eval.template": _runtime("eval", env=[{"name": "OMP_NUM_THREADS", "value": "8"}])}),
    bad("template mounts over /dev/shm", "template.spec.containers.eval.volumeMounts./dev/shm",
        **{"spec.eval.template": _runtime("eval", volumeMounts=[{"name": "x", "mountPath": "/dev/shm"}])}),
    bad("template sets the restart policy", "template.spec.restartPolicy",
        **{"spec.train.template": {"spec": {"restartPolicy": "Always"}}}),
    bad("template sets the grace period", "template.spec.terminationGracePeriodSeconds",
        **{"spec.eval.template": {"spec": {"terminationGracePeriodSeconds": 1}}}),
    bad("template sets the subdomain", "template.spec.subdomain",
        **{"spec.train.template": {"spec": {"subdomain": "x"}}}),
    bad("template takes the spec volume's name", "template.spec.volumes.spec",
        **{"spec.eval.template": {"spec": {"volumes": [{"name": "spec", "emptyDir": {}}]}}}),
    bad("template takes the validate init container's name", "template.spec.initContainers.validate",
        **{"spec.train.template": {"spec": {"initContainers": [{"name": "validate", "image": "x"}]}}}),
    bad("template sets the role label", "template.metadata.labels.rlightning.io/role",
        **{"spec.eval.template": {"metadata": {"labels": {"rlightning.io/role": "train"}}}}),
    bad("template sets the managed-by label", "template.metadata.labels.app.kubernetes.io/managed-by",
        **{"spec.train.template": {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}}}),
    bad("trainer template turns off do-not-disrupt", "template.metadata.annotations.karpenter.sh/do-not-disrupt",
        **{"spec.train.template": {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "false"}}}}),
    bad("node selector in the template, not the shorthand", "template.spec.nodeSelector",
        **{"spec.eval.template": {"spec": {"nodeSelector": {"a": "b"}}}}),
    bad("affinity in the template, not the shorthand", "template.spec.affinity",
        **{"spec.train.template": {"spec": {"affinity": {"nodeAffinity": {}}}}}),
    bad("template metadata other than labels and annotations", "spec.eval.template.metadata.name",
        **{"spec.eval.template": {"metadata": {"name": "x"}}}),
    bad("two template containers of one name", "spec.train.template.spec.containers",
        **{"spec.train.template": {"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "a"}]}}}),
    bad("template container without a name", "spec.eval.template.spec.containers[0].name",
        **{"spec.eval.template": {"spec": {"containers": [{"image": "x"}]}}}),
    bad("a non-NCCL setting in nccl", "spec.nccl.GLOO_SOCKET_IFNAME", **{"spec.nccl": {"GLOO_SOCKET_IFNAME": "eth0"}}),
    bad("more GPUs than ranks per trainer pod", "spec.train.procsPerNode",
        **{"spec.train.pod.resources": {"limits": {_GPU: "4"}}}),
    bad("fewer GPUs than ranks per trainer pod", "spec.train.procsPerNode",
        **{"spec.train.procsPerNode": 2, "spec.train.pod.resources": {"limits": {_GPU: "1"}}}),
    bad("shm size not a quantity", "spec.eval.pod.shmSize", **{"spec.eval.pod.shmSize": "lots"}),
    # -- metadata and the object itself ---------------------------------------------------------------------------
    bad("name not a DNS label", "metadata.name", **{"metadata.name": "Bad_Name"}),
    bad("name too long for children", "metadata.name", **{"metadata.name": "a" * 41}),
    bad("label value with spaces", "metadata.labels.team", **{"metadata.labels": {"team": "rl team"}}),
    bad("label key with spaces", "metadata.labels", **{"metadata.labels": {"bad key": "x"}}),
    bad("label value not a string", "metadata.labels.tier", **{"metadata.labels": {"tier": 1}}),
    bad("missing name", "metadata.name", **{"metadata.name": None}),
    bad("missing env", "spec.env", **{"spec.env": None}),
    Case("null env", _replace("  env:\n    id: CartPole-v1\n    numEnvs: 4\n", "  env: null\n"), "spec.env"),
    bad("missing env id", "spec.env.id", **{"spec.env.id": None}),
    bad("wrong apiVersion", "apiVersion", apiVersion="rlightning.io/v1"),
    bad("wrong kind", "kind", kind="PolicyGroups"),
    # -- files that are no manifest -------------------------------------------------------------------------------
    Case("binary", bytes(range(256)) * 4, "not UTF-8"),
    Case("NUL bytes in UTF-8", b"apiVersion: rlightning.io/v1alpha1\x00\x01\n", "not valid YAML"),
    Case("not YAML", _text("apiVersion: rlightning.io/v1alpha1\nkind: [PolicyGroup\n"), "not valid YAML"),
    Case("a scalar, not an object", _text("just some words\n"), "<root>"),
    Case("a list, not an object", _text("- 1\n- 2\n"), "<root>"),
    Case("empty file", b"", "expected one YAML document"),
    # -- what only the CLI's deep checks can see ------------------------------------------------------------------
    Case("two documents", (_EXAMPLE_TEXT + "\n---\n" + _EXAMPLE_TEXT.replace("name: cartpole", "name: other")).encode(),
         "expected one YAML document",
         cli_only="a manifest file holds one PolicyGroup (what run and validate read); kubectl applies each document"),
    Case("Latin-1 text", _EXAMPLE_TEXT.replace("# CartPole", "# Caf\u00e9 CartPole").encode("latin-1"), "not UTF-8",
         cli_only="kubectl reads a byte that is not UTF-8 as U+FFFD and goes on; the CLI does not guess encodings"),
    Case("unregistered env id", edited(**{"spec.env.id": "NoSuchEnv-v9"}), "spec.env.id",
         cli_only="the gymnasium registry is in the image, not the API server"),
    Case("env kwargs the env does not take", edited(**{"spec.env.kwargs": {"bogus": 1}}), "spec.env",
         cli_only="gymnasium.make with spec.env.kwargs runs only where the env is installed"),
    Case("policy module missing", edited(**{"spec.policy.policyClass": "no_such_module.sub:Policy"}),
         "spec.policy.policyClass", cli_only="importing the policy class needs the image's Python packages"),
    Case("policy class missing", edited(**{"spec.policy.policyClass": "rlightning.policy.ppo:NoSuchPolicy"}),
         "spec.policy.policyClass", cli_only="importing the policy class needs the image's Python packages"),
    Case("not a policy class", edited(**{"spec.policy.policyClass": "collections:OrderedDict"}),
         "spec.policy.policyClass", cli_only="whether a class is a BasePolicy is known only by importing it"),
    Case("policy kwargs the class refuses", edited(**{"spec.policy.policyKwargs.clipCoeff": 0.2}),
         "spec.policy.policyKwargs.clipCoeff", cli_only="policyKwargs is free-form: the class's own model checks it"),
    Case("continuous-action SAC with a Discrete env",
         edited(**{"spec.policy.policyClass": "rlightning.policy.sac:SACPolicy", "spec.policy.policyKwargs": {}}),
         "spec.policy.policyClass", cli_only="the env's spaces are known only by making the env"),
    # -- good manifests: both accept --------------------------------------------------------------------------------
    good("the example as it is"),
    good("an integer for a number field", **{"spec.policy.optim.lr": 1, "spec.weightSync.timeoutSeconds": 30}),
    Case("a null for a defaulted field (pruned, then defaulted)", _replace("numEnvs: 4", "numEnvs: ~"), None),
    Case("a null for a nullable field", _replace("targetEvalReturn: 475", "targetEvalReturn: null"), None),
    Case("an integer written as 2.0, 1e1 or 0o1", _replace("numEnvs: 4", "numEnvs: 2.0")
         .replace(b"rolloutSteps: 32", b"rolloutSteps: 1e1").replace(b"procsPerNode: 1", b"procsPerNode: 0o1"), None),
    good("a percentage disruption budget", **{"spec.eval.disruptionBudget": {"maxUnavailable": "50%"}}),
    good("a numeric disruption budget", **{"spec.eval.disruptionBudget": {"minAvailable": 1}}),
    good("labels and annotations", **{"metadata.labels": {"team": "rl", "example.com/tier": "gold"},
                                      "metadata.annotations": {"note": "any text at all"}}),
    Case("a date-like string stays a string",
         _text(_EXAMPLE_TEXT.replace("spec:\n", "spec:\n  image: 2024-01-01\n", 1)), None),
    good("a status block is ignored", status={"phase": "Running"}),
    good("pod templates, NCCL settings, /dev/shm and GPUs", **{
        "spec.train.template": {
            "metadata": {"labels": {"team": "rl"}, "annotations": {"example.com/owner": "me"}},
            "spec": {"imagePullSecrets": [{"name": "registry"}], "serviceAccountName": "s3",
                     "volumes": [{"name": "assets", "configMap": {"name": "assets"}}],
                     "containers": [{"name": "train", "envFrom": [{"secretRef": {"name": "s3"}}], "workingDir": "/w",
                                     "env": [{"name": "DATA", "value": "/assets"}],
                                     "volumeMounts": [{"name": "assets", "mountPath": "/assets"}]},
                                    {"name": "sidecar", "image": "busybox", "command": ["sleep", "inf"]}]}},
        "spec.eval.template": {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}},
                               "spec": {"runtimeClassName": "nvidia", "securityContext": {"fsGroup": 1000}}},
        "spec.nccl": {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"},
        "spec.train.procsPerNode": 2, "spec.train.pod.resources": {"limits": {_GPU: "2"}},
        "spec.eval.pod.shmSize": "2Gi"}),
    good("async rollouts with one worker per env copy", **{"spec.policy.rolloutMode": "async",
                                                           "spec.eval.rolloutWorkers": 4}),
]
"""The corpus: at least 50 broken manifests, a few good ones."""

assert len({case.name for case in CASES}) == len(CASES), "case names must be unique"
