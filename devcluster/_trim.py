"""Build an add-on from a trimmed copy of its upstream module: only the plugins the dev cluster uses are compiled.

KEDA's operator and adapter link every scaler it ships (``pkg/scalers``, one Go package of about 70 scalers), and
with them the cloud SDKs those import: half of the 3,450 packages a cold build compiles. The tests use one trigger
(``metrics-api``). A trimmed build copies the module from Go's module cache, deletes the scalers not kept, keeps
only their cases in the scaler factory's switch (between upstream's ``// TRIGGERS-START`` and ``// TRIGGERS-END``
markers, which KEDA's own tooling keeps the list by), and builds with ``go build -modfile`` against the wrapper's
go.mod plus a ``replace`` of the module with the copy (Go refuses ``-overlay`` files under the module cache). The
wrapper's go.mod and go.sum stay as generated, so the module graph, and every version, is the wrapper's (the
add-ons' shared one, ``_gomod.SHARED_ADDONS``: the packages the trimmed build compiles are those the others reuse).

A new upstream release that moves a kept scaler or the markers fails here, by name, instead of building something
else.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil

from devcluster import _gomod


class TrimError(RuntimeError):
    """Raised when the upstream source no longer has what a trim expects (a file, the markers, a kept case)."""


@dataclasses.dataclass(frozen=True)
class SourceTrim:
    """What to keep of one upstream module.

    Attributes:
        module (str): Upstream module path (``github.com/kedacore/keda/v2``).
        package_dir (str): The package whose files are trimmed, relative to the module root.
        keep_files (tuple[str, ...]): File names kept in ``package_dir``; every other ``.go`` file there is deleted.
        switch_file (str): File (relative to the module root) with the marked switch of constructors.
        keep_cases (tuple[str, ...]): Case labels kept in the switch; the ``default`` case is always kept.
        shim (str): Go source added to ``package_dir`` for identifiers the kept files use but deleted ones declared.
    """

    module: str
    package_dir: str
    keep_files: tuple[str, ...]
    switch_file: str
    keep_cases: tuple[str, ...]
    shim: str = ""


KEDA = SourceTrim(
    module="github.com/kedacore/keda/v2",
    package_dir="pkg/scalers",
    keep_files=("scaler.go", "cpu_memory_scaler.go", "metrics_api_scaler.go"),
    switch_file="pkg/scaling/scalers_builder.go",
    keep_cases=("cpu", "memory", "metrics-api"),
    # Declared upstream in azure_queue_scaler.go, used by the metrics-api scaler.
    shim='package scalers\n\nconst externalMetricType = "External"\n',
)
"""KEDA with its built-in resource triggers (``cpu``, ``memory``) and ``metrics-api``, the one the tests use."""

SWITCH_START = "// TRIGGERS-START"
SWITCH_END = "// TRIGGERS-END"
_CASE = re.compile(r'^\s*case "([^"]+)":', re.MULTILINE)
_ARM = re.compile(r"^(?=\s*(?:case |default:))", re.MULTILINE)


def trim_switch(source: str, keep: tuple[str, ...]) -> str:
    """Keep only the ``keep`` cases (and ``default``) of the switch between the trigger markers.

    Args:
        source (str): Go source holding one marked switch whose arms are ``case "name":`` or ``default:``.
        keep (tuple[str, ...]): Case labels to keep.

    Returns:
        str: The source with every other arm removed.

    Raises:
        TrimError: The markers are missing, or a kept label is not a case of the switch.
    """
    start, end = source.find(SWITCH_START), source.find(SWITCH_END)
    if start < 0 or end < start:
        raise TrimError(f"no {SWITCH_START} ... {SWITCH_END} block")
    head, *arms = _ARM.split(source[start:end])
    if not arms or not arms[-1].lstrip().startswith("default:"):
        raise TrimError("the switch's last arm is not its default (it holds the closing brace)")
    labels = {match.group(1) for match in _CASE.finditer(source[start:end])}
    missing = sorted(set(keep) - labels)
    if missing:
        raise TrimError(f"the switch has no case {', '.join(missing)}")
    kept = [arm for arm in arms if (label := _CASE.match(arm)) is None or label.group(1) in keep]
    return source[:start] + head + "".join(kept) + source[end:]


def prepare(trim: SourceTrim, wrapper: str, work_dir: pathlib.Path) -> pathlib.Path:
    """Write the trimmed copy and the go.mod that points at it.

    Args:
        trim (SourceTrim): What to keep.
        wrapper (str): The wrapper module's folder under ``devcluster/go/`` (its go.mod and go.sum are reused).
        work_dir (pathlib.Path): Scratch folder (replaced): ``src/`` holds the copy, ``go.mod``/``go.sum`` the module.

    Returns:
        pathlib.Path: The go.mod to pass to ``go build -modfile``.

    Raises:
        TrimError: A kept file or the switch is missing upstream.
        _gomod.ModuleCacheError: The module cannot be downloaded.
    """
    upstream = _gomod.module_dir(wrapper, trim.module)
    shutil.rmtree(work_dir, ignore_errors=True)
    source = work_dir / "src"
    shutil.copytree(upstream, source, copy_function=shutil.copyfile)
    for folder in (source, *(path for path in source.rglob("*") if path.is_dir())):
        folder.chmod(0o755)  # the module cache's folders are read-only, and copytree copies their mode
    package = source / trim.package_dir
    present = {path.name for path in package.glob("*.go")}
    missing = sorted(set(trim.keep_files) - present)
    if missing:
        raise TrimError(f"{trim.module}: {trim.package_dir} has no {', '.join(missing)}")
    for name in present - set(trim.keep_files):
        (package / name).unlink()
    if trim.shim:
        (package / "zz_rlightning_trim.go").write_text(trim.shim)
    switch = source / trim.switch_file
    try:
        switch.write_text(trim_switch(switch.read_text(), trim.keep_cases))
    except TrimError as exc:
        raise TrimError(f"{trim.module}: {trim.switch_file}: {exc}") from None
    gomod = (_gomod.GO_DIR / wrapper / "go.mod").read_text()
    (work_dir / "go.mod").write_text(f"{gomod}\nreplace {trim.module} => {source}\n")
    shutil.copyfile(_gomod.GO_DIR / wrapper / "go.sum", work_dir / "go.sum")
    return work_dir / "go.mod"
