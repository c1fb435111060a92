"""Generate the Go wrapper modules under ``devcluster/go/`` from the pinned upstream releases.

``go install k8s.io/kubernetes/cmd/kube-apiserver@v1.34.4`` fails because that module requires its staging
modules (k8s.io/api, k8s.io/client-go, ...) at ``v0.0.0`` and points them at ``./staging`` with ``replace``
directives, which only apply when it is the main module. A wrapper module that requires the release and
replaces each staging module with its published tag (``v0.34.4``) builds the commands. The replace list is
read from the release's own go.mod here, never typed by hand. The other wrappers (etcd, kwok, helm, coredns,
metrics-server, karpenter, keda, kueue) carry ``tool`` directives; an upstream ``replace`` that points at another
published module version (KEDA has one) only applies when that module is the main module, so it is copied into
the wrapper (:func:`module_replacements`); replaces that point at local paths of the upstream repository (etcd's)
are dropped, the required versions they name being the published ones.

Run ``python -m devcluster gomod`` after bumping a version in ``_versions.py``; it rewrites each go.mod, then
``go mod tidy`` writes the matching go.sum. Both files are committed.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
from collections.abc import Callable

from devcluster import _versions
from devcluster import _toolchain

GO_DIR = pathlib.Path(__file__).resolve().parent / "go"
"""Folder holding one wrapper module per sub-folder."""

WRAPPER_PREFIX = "rlightning.dev/devcluster"
"""Module path prefix of the wrapper modules (never published)."""

ETCD_MAIN = """\
// Command etcd runs the etcd server; a wrapper so etcd builds from its published modules.
package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
\tetcdmain.Main(os.Args)
}
"""



class ModuleCacheError(RuntimeError):
    """Raised when ``go list -m`` cannot name a pinned module's folder in Go's module cache."""


def module_dir(wrapper: str, module: str) -> pathlib.Path:
    """Return the folder of an upstream module, at the version its wrapper pins, in Go's module cache.

    The add-ons read files that ship in their module (CRDs, stage configs, webhook manifests) from there, so they
    always match the binary built from the same version. ``go mod download`` fetches the module when it is missing
    (a test may ask before the add-on's build did).

    Args:
        wrapper (str): The wrapper module's folder under :data:`GO_DIR` (``"keda"``).
        module (str): The upstream module path (``"github.com/kedacore/keda/v2"``).

    Returns:
        pathlib.Path: ``$GOMODCACHE/<module>@<version>``.

    Raises:
        ModuleCacheError: ``go mod download`` failed (the module is not cached and the proxy is unreachable).
        _toolchain.ToolchainError: No Go toolchain is found.
    """
    proc = subprocess.run(
        [_toolchain.go_binary(), "mod", "download", "-json", module],
        cwd=GO_DIR / wrapper,
        capture_output=True,
        text=True,
        env=_toolchain.go_env(),
    )
    try:
        found = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except json.JSONDecodeError:
        found = {}
    if proc.returncode != 0 or not found.get("Dir"):
        detail = found.get("Error") or proc.stderr[-2000:]
        raise ModuleCacheError(f"go mod download {module} (in {wrapper}): exit {proc.returncode}: {detail}")
    return pathlib.Path(found["Dir"])


_LOCAL_REPLACE = re.compile(r"^\s*(k8s\.io/[\w.\-]+)\s*=>\s*\./staging/src/(k8s\.io/[\w.\-]+)\s*$")
_MODULE_REPLACE = re.compile(r"^\s*(?:replace\s+)?(\S+(?:\s+v\S+)?)\s*=>\s*([^./\s]\S*\s+v\S+)\s*$")
_GODEBUG = re.compile(r"^godebug\s.*$", re.MULTILINE)
_GO_DIRECTIVE = re.compile(r"^go\s+(\S+)\s*$", re.MULTILINE)


def upstream_gomod(module: str, version: str) -> str:
    """Download a module's go.mod through the Go module proxy and return its text.

    Args:
        module (str): Module path, e.g. ``"k8s.io/kubernetes"``.
        version (str): Tag, e.g. ``"v1.34.4"``.

    Returns:
        str: The go.mod text of that release.

    Raises:
        subprocess.CalledProcessError: When ``go mod download`` fails (unknown version, no proxy).
    """
    out = subprocess.run(
        [_toolchain.go_binary(), "mod", "download", "-json", f"{module}@{version}"],
        check=True,
        capture_output=True,
        text=True,
        env=_toolchain.go_env(),
    ).stdout
    return pathlib.Path(json.loads(out)["GoMod"]).read_text()


def staging_replacements(kubernetes_gomod: str) -> list[str]:
    """Return the staging module paths that a Kubernetes release's go.mod replaces with ``./staging`` paths.

    Args:
        kubernetes_gomod (str): Text of k8s.io/kubernetes's go.mod.

    Returns:
        list[str]: Sorted module paths such as ``["k8s.io/api", "k8s.io/apiextensions-apiserver", ...]``.

    Raises:
        ValueError: When no staging replacement is found (the go.mod layout changed upstream).
    """
    found = sorted(m.group(1) for line in kubernetes_gomod.splitlines() if (m := _LOCAL_REPLACE.match(line)))
    if not found:
        raise ValueError("k8s.io/kubernetes go.mod: no `k8s.io/X => ./staging/src/k8s.io/X` replace directives found")
    return found


def module_replacements(gomod_text: str) -> list[str]:
    """Return a go.mod's ``replace`` directives whose target is a published module version (not a local path).

    Args:
        gomod_text (str): Text of an upstream go.mod.

    Returns:
        list[str]: Sorted ``"old [version] => new version"`` strings, e.g. KEDA's
        ``"github.com/nexus-rpc/nexus-proto-annotations v0.1.0 => github.com/nexus-rpc/... v0.1.1-..."``.
    """
    found = []
    in_block = False
    for line in gomod_text.splitlines():
        stripped = line.split("//", 1)[0].strip()
        if stripped.startswith("replace ("):
            in_block = True
            continue
        if in_block and stripped == ")":
            in_block = False
            continue
        if not (in_block or stripped.startswith("replace ")):
            continue
        match = _MODULE_REPLACE.match(stripped)
        if match:
            found.append(f"{' '.join(match.group(1).split())} => {' '.join(match.group(2).split())}")
    return sorted(found)


def kubernetes_gomod(kubernetes_gomod_text: str, version: str = _versions.KUBERNETES) -> str:
    """Build the wrapper go.mod for the Kubernetes commands (before ``go mod tidy`` adds the requirements).

    Args:
        kubernetes_gomod_text (str): Text of the release's own go.mod (source of the go, godebug and replace lines).
        version (str, optional): The Kubernetes tag. Defaults to :data:`_versions.KUBERNETES`.

    Returns:
        str: go.mod text with ``tool`` lines for kube-apiserver, kube-controller-manager, kube-scheduler,
        kubectl and kubelet, the release's ``godebug`` line and one ``replace`` per staging module.
    """
    staging = _versions.staging_version(version)
    go_line = _GO_DIRECTIVE.search(kubernetes_gomod_text)
    godebug = _GODEBUG.search(kubernetes_gomod_text)
    lines = [
        "// Generated by `python -m devcluster gomod` from k8s.io/kubernetes " + version + "'s go.mod; do not edit.",
        f"module {WRAPPER_PREFIX}/kubernetes",
        "",
        f"go {go_line.group(1) if go_line else '1.24.0'}",
        "",
    ]
    if godebug:
        lines += [godebug.group(0), ""]
    lines += [
        "tool (",
        *(f"\tk8s.io/kubernetes/cmd/{cmd}" for cmd in _toolchain.KUBERNETES_COMMANDS),
        ")",
        "",
        f"require k8s.io/kubernetes {version}",
        "",
        "replace (",
        *(f"\t{mod} => {mod} {staging}" for mod in staging_replacements(kubernetes_gomod_text)),
        ")",
        "",
    ]
    return "\n".join(lines)


def simple_gomod(
    name: str, module: str, version: str, tools: list[str], go_version: str, replaces: list[str] | None = None
) -> str:
    """Build a wrapper go.mod that requires one module and lists its commands as tools.

    Args:
        name (str): Wrapper name (sub-folder of ``go/``).
        module (str): Upstream module path.
        version (str): Upstream tag.
        tools (list[str]): Package paths of the commands (empty when the wrapper has its own main package).
        go_version (str): Value of the ``go`` directive (the upstream module's, so the toolchain check matches).
        replaces (list[str] | None, optional): ``replace`` directives to repeat (:func:`module_replacements` of the
            upstream go.mod). Defaults to None (none).

    Returns:
        str: go.mod text.
    """
    lines = [
        f"// Generated by `python -m devcluster gomod` for {module} {version}; do not edit.",
        f"module {WRAPPER_PREFIX}/{name}",
        "",
        f"go {go_version}",
        "",
    ]
    if tools:
        lines += ["tool (", *(f"\t{t}" for t in tools), ")", ""]
    lines += [f"require {module} {version}", ""]
    if replaces:
        lines += ["replace (", *(f"\t{r}" for r in replaces), ")", ""]
    return "\n".join(lines)


def _go_version_of(gomod_text: str) -> str:
    match = _GO_DIRECTIVE.search(gomod_text)
    return match.group(1) if match else "1.24.0"


def generate(log: Callable[[str], None] = print) -> None:
    """Rewrite every wrapper go.mod from the pinned versions and run ``go mod tidy`` in each.

    Args:
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Raises:
        subprocess.CalledProcessError: When a download or ``go mod tidy`` fails.
        ValueError: When the Kubernetes go.mod layout is not the expected one.
    """
    k8s_text = upstream_gomod("k8s.io/kubernetes", _versions.KUBERNETES)
    etcd_text = upstream_gomod("go.etcd.io/etcd/server/v3", _versions.ETCD)
    kwok_text = upstream_gomod("sigs.k8s.io/kwok", _versions.KWOK)
    helm_text = upstream_gomod("helm.sh/helm/v3", _versions.HELM)
    coredns_text = upstream_gomod("github.com/coredns/coredns", _versions.COREDNS)
    metrics_server_text = upstream_gomod("sigs.k8s.io/metrics-server", _versions.METRICS_SERVER)
    karpenter_text = upstream_gomod("sigs.k8s.io/karpenter", _versions.KARPENTER)
    keda_text = upstream_gomod("github.com/kedacore/keda/v2", _versions.KEDA)
    kueue_text = upstream_gomod("sigs.k8s.io/kueue", _versions.KUEUE)
    files = {
        "kubernetes": kubernetes_gomod(k8s_text),
        "etcd": simple_gomod("etcd", "go.etcd.io/etcd/server/v3", _versions.ETCD, [], _go_version_of(etcd_text)),
        "kwok": simple_gomod(
            "kwok", "sigs.k8s.io/kwok", _versions.KWOK, ["sigs.k8s.io/kwok/cmd/kwok"], _go_version_of(kwok_text)
        ),
        "helm": simple_gomod(
            "helm", "helm.sh/helm/v3", _versions.HELM, ["helm.sh/helm/v3/cmd/helm"], _go_version_of(helm_text)
        ),
        "coredns": simple_gomod(
            "coredns",
            "github.com/coredns/coredns",
            _versions.COREDNS,
            ["github.com/coredns/coredns"],
            _go_version_of(coredns_text),
        ),
        "metrics-server": simple_gomod(
            "metrics-server",
            "sigs.k8s.io/metrics-server",
            _versions.METRICS_SERVER,
            ["sigs.k8s.io/metrics-server/cmd/metrics-server"],
            _go_version_of(metrics_server_text),
        ),
        "karpenter": simple_gomod(
            "karpenter",
            "sigs.k8s.io/karpenter",
            _versions.KARPENTER,
            ["sigs.k8s.io/karpenter/kwok"],
            _go_version_of(karpenter_text),
        ),
        "keda": simple_gomod(
            "keda",
            "github.com/kedacore/keda/v2",
            _versions.KEDA,
            ["github.com/kedacore/keda/v2/cmd/operator", "github.com/kedacore/keda/v2/cmd/adapter"],
            _go_version_of(keda_text),
            module_replacements(keda_text),
        ),
        "kueue": simple_gomod(
            "kueue", "sigs.k8s.io/kueue", _versions.KUEUE, ["sigs.k8s.io/kueue/cmd/kueue"], _go_version_of(kueue_text)
        ),
    }
    for name, text in files.items():
        folder = GO_DIR / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "go.mod").write_text(text)
        (folder / "go.sum").unlink(missing_ok=True)
        if name == "etcd":
            (folder / "main.go").write_text(ETCD_MAIN)
        log(f"gomod: wrote {folder / 'go.mod'}; running go mod tidy")
        subprocess.run([_toolchain.go_binary(), "mod", "tidy"], cwd=folder, check=True, env=_toolchain.go_env())
