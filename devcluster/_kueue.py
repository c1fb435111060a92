"""Kueue on a running dev cluster: gang admission of Jobs (quota for all their pods at once), as a host process.

Built on demand from its Go module (``_build.build_addon("kueue")``, binary ``kueue`` from ``cmd/kueue``, cached
under its own key). :meth:`Kueue.start` installs what Kueue's release installs, read from the module at the pinned
version, less the Deployment and RBAC (the process runs with the admin kubeconfig):

- the namespace ``kueue-system``, the empty Secret its certificate rotation fills, and the webhook Service, here
  of type ExternalName on loopback (``_addon``);
- every CRD of ``config/components/crd`` with the conversion webhooks its kustomization patches in
  (:func:`crd_manifests`);
- the admission webhooks of ``config/components/webhook`` for Kueue's own kinds and batch Jobs
  (:func:`webhook_configurations`; the others belong to integrations that are off, and the pod and Deployment
  ones would intercept every pod of the cluster).

Kueue then writes its CA and serving certificate into the Secret and injects the CA into those webhooks and CRDs
(its internal certificate management, as in a cluster). In a cluster the kubelet mounts that Secret into Kueue's
pod, and Kueue waits for the files; here :meth:`Kueue.start` writes them into ``<workdir>/kueue-certs``, and Kueue
reports ``/readyz``. Only the ``batch/job`` integration is on
(``_components.KUEUE_INTEGRATIONS``). :meth:`Kueue.stop` deletes the webhook configurations before it stops the
process, so that the cluster never calls a webhook that is gone (they fail closed); the CRDs, the namespace and
any queues stay.
"""

from __future__ import annotations

import base64
import copy
import json
import pathlib
from collections.abc import Callable

import yaml

from devcluster import _addon
from devcluster import _cluster
from devcluster import _components
from devcluster import _gomod
from devcluster import _http
from devcluster import _ports
from devcluster import _versions

MODULE = "sigs.k8s.io/kueue"
"""The Go module the add-on is built from (and its CRDs and webhook manifests are read from)."""

CRD_FOLDER = "config/components/crd"
"""The CRDs (``bases/``) and the kustomization that lists them and their conversion-webhook patches."""

WEBHOOK_MANIFESTS = "config/components/webhook/manifests.yaml"
"""The Mutating- and ValidatingWebhookConfiguration that controller-gen writes for every webhook Kueue serves."""

NAME_PREFIX = "kueue-"
"""The ``namePrefix`` of Kueue's ``config/default`` kustomization, given to the webhook configurations."""

WEBHOOK_GROUPS = frozenset({"kueue.x-k8s.io", "batch"})
"""API groups whose webhooks are registered: Kueue's own kinds and batch Jobs."""

CERTIFICATE_FILES = ("tls.crt", "tls.key")
"""The Secret's keys that Kueue's webhook server reads as files from its ``certDir``."""

NAMESPACE = _components.KUEUE_NAMESPACE
SERVICE = _components.KUEUE_WEBHOOK_SERVICE


class KueueError(_addon.AddonError):
    """Raised when Kueue exits or is not ready in time (with its log tail)."""


def _documents(path: pathlib.Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _service_ref(path: str, port: int) -> dict:
    return {"namespace": NAMESPACE, "name": SERVICE, "path": path, "port": port}


def crd_manifests(folder: pathlib.Path, port: int) -> list[dict]:
    """Kueue's CRDs as its release installs them: ``config/components/crd/bases`` with the conversion webhooks that
    ``config/components/crd/kustomization.yaml`` patches in, pointed at the webhook Service.

    Args:
        folder (pathlib.Path): The module folder (``_gomod.module_dir``).
        port (int): Kueue's webhook port (``ports.kueue_webhook``).

    Returns:
        list[dict]: One CustomResourceDefinition per entry of the kustomization's ``resources``, in its order.

    Raises:
        OSError: A listed file is missing.
        yaml.YAMLError: A file is not YAML.
    """
    crd_folder = folder / CRD_FOLDER
    kustomization = yaml.safe_load((crd_folder / "kustomization.yaml").read_text())
    conversions = {}
    for patch in kustomization.get("patches") or []:
        for doc in _documents(crd_folder / patch["path"]):
            conversions[doc["metadata"]["name"]] = doc["spec"]["conversion"]
    crds = []
    for resource in kustomization["resources"]:
        (crd,) = _documents(crd_folder / resource)
        conversion = conversions.get(crd["metadata"]["name"])
        if conversion is not None:
            conversion = copy.deepcopy(conversion)
            client = conversion["webhook"]["clientConfig"]
            client["service"] = _service_ref(client["service"].get("path", "/convert"), port)
            crd["spec"]["conversion"] = conversion
        crds.append(crd)
    return crds


def webhook_configurations(folder: pathlib.Path, port: int) -> list[dict]:
    """Kueue's admission webhook configurations, named as its release names them, with the webhooks of
    :data:`WEBHOOK_GROUPS` only, each pointed at the webhook Service on ``port``.

    Args:
        folder (pathlib.Path): The module folder (``_gomod.module_dir``).
        port (int): Kueue's webhook port (``ports.kueue_webhook``).

    Returns:
        list[dict]: The MutatingWebhookConfiguration and the ValidatingWebhookConfiguration.

    Raises:
        OSError: The manifest file is missing.
    """
    configurations = []
    for doc in _documents(folder / WEBHOOK_MANIFESTS):
        doc["metadata"]["name"] = NAME_PREFIX + doc["metadata"]["name"]
        kept = []
        for webhook in doc["webhooks"]:
            if all(group in WEBHOOK_GROUPS for rule in webhook["rules"] for group in rule["apiGroups"]):
                webhook["clientConfig"]["service"] = _service_ref(webhook["clientConfig"]["service"]["path"], port)
                kept.append(webhook)
        doc["webhooks"] = kept
        configurations.append(doc)
    return configurations


def _plural(kind: str) -> str:
    return {"MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
            "ValidatingWebhookConfiguration": "validatingwebhookconfigurations"}[kind]


class Kueue(_addon.Addon):
    """Kueue admitting Jobs on a started :class:`devcluster.Cluster`.

    :meth:`start` returns once the CRDs are Established, Kueue wrote its certificate into the Secret (mounted into
    ``<workdir>/kueue-certs`` here) and its ``/readyz`` answers 200. :meth:`stop` unregisters the webhooks before it
    stops the process; the CRDs, the namespace and every queue and Workload stay (a Workload still holding Kueue's
    finalizer keeps its namespace Terminating until Kueue runs again: delete Jobs while it runs).

    Args:
        cluster (_cluster.Cluster): The running control plane (started by this process or attached).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Example:
        >>> with Kueue(cluster):  # doctest: +SKIP
        ...     cluster.kubectl("apply", "-f", "examples/autoscaling/kueue.yaml")
    """

    name = "kueue"
    version = _versions.KUEUE
    log_name = "kueue"
    error = KueueError

    def __init__(self, cluster: _cluster.Cluster, log: Callable[[str], None] = print) -> None:
        super().__init__(cluster, log)
        self._webhooks: list[dict] = []

    @property
    def _cert_dir(self) -> pathlib.Path:
        return self.cluster.workdir / "kueue-certs"

    def _install(self, deadline: float) -> None:
        cluster = self.cluster
        port = cluster.ports.kueue_webhook
        folder = _gomod.module_dir("kueue", MODULE)
        _addon.create(self._api, "/api/v1/namespaces",
                      {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        _addon.create(self._api, f"/api/v1/namespaces/{NAMESPACE}/secrets",
                      {"apiVersion": "v1", "kind": "Secret",
                       "metadata": {"name": _components.KUEUE_WEBHOOK_SECRET, "namespace": NAMESPACE}})
        # The port may differ from a previous start on another slot: replace the Service.
        self._api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/services/{SERVICE}")
        _addon.create(self._api, f"/api/v1/namespaces/{NAMESPACE}/services",
                      _addon.external_name_service(SERVICE, NAMESPACE, port))
        crd_file = cluster.workdir / "kueue-crds.json"
        crds = crd_manifests(folder, port)
        crd_file.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}))
        _addon.apply_crds(cluster, [crd_file], tuple(crd["metadata"]["name"] for crd in crds), deadline)
        self._webhooks = webhook_configurations(folder, port)
        for configuration in self._webhooks:
            kind = _plural(configuration["kind"])
            self._api.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/"
                                        f"{configuration['metadata']['name']}")
            _addon.create(self._api, f"/apis/admissionregistration.k8s.io/v1/{kind}", configuration)

    def _spawn(self, binary: pathlib.Path) -> None:
        cluster = self.cluster
        config_file = cluster.workdir / "kueue-config.yaml"
        config_file.write_text(yaml.safe_dump(_components.kueue_configuration(cluster.ports, self._cert_dir)))
        argv, env = _components.kueue(cluster.kubeconfig, binary, config_file)
        self._start_process(self.log_name, argv, env)

    def _ready(self, deadline: float) -> None:
        self._wait("its certificate in the Secret", deadline, self._certificate)
        self._mount_certificate(self._cert_dir)
        readyz = f"http://{_ports.HOST}:{self.cluster.ports.kueue_health}/readyz"
        self._wait(f"{readyz} to answer", deadline, lambda: _http.healthy(readyz))

    def _certificate(self) -> dict[str, str] | None:
        """The serving certificate and key (base64) once Kueue's rotation wrote them into the Secret, else None."""
        secret = self._api.get_json(f"/api/v1/namespaces/{NAMESPACE}/secrets/{_components.KUEUE_WEBHOOK_SECRET}")
        data = (secret or {}).get("data") or {}
        return {name: data[name] for name in CERTIFICATE_FILES} if all(n in data for n in CERTIFICATE_FILES) else None

    def _mount_certificate(self, cert_dir: pathlib.Path) -> None:
        """Write the Secret's certificate and key into ``cert_dir``, as the kubelet mounts that Secret into Kueue's
        pod: the rotation fills the Secret and waits for the files to appear, and the webhook server reads them.
        """
        cert_dir.mkdir(parents=True, exist_ok=True)
        for name, encoded in (self._certificate() or {}).items():
            path = cert_dir / name
            path.write_bytes(base64.b64decode(encoded))
            path.chmod(0o600)

    def _unregister(self) -> None:
        # Before the process stops: a webhook that is gone fails closed, refusing every Job.
        for configuration in self._webhooks:
            self._api.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{_plural(configuration['kind'])}/"
                                        f"{configuration['metadata']['name']}")
        self._webhooks = []
