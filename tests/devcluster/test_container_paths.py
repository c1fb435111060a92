"""The real node's containers see the checkout, its virtualenv and the virtualenv's scripts at fixed paths of their
own, whatever the host's are (a clone under /tmp, a path with a space)."""

from __future__ import annotations

import io
import pathlib
import sys
import tarfile

from pip._vendor.distlib.scripts import ScriptMaker

from devcluster import _images, _nodeconfig, _realnode


def _pip_script(tmp_path: pathlib.Path, interpreter: str) -> bytes:
    """A console script as pip writes it (its vendored distlib), for an interpreter at `interpreter`."""
    maker = ScriptMaker(None, str(tmp_path), add_launchers=False)
    maker.executable, maker.variants = interpreter, {""}
    (path,) = maker.make("demo = json.tool:main")
    return pathlib.Path(path).read_bytes()


def test_a_pip_script_runs_the_containers_virtualenv_python(tmp_path):
    venv = pathlib.Path("/tmp/clone/.venv")
    relocated = _nodeconfig.container_script(_pip_script(tmp_path, f"{venv}/bin/python"), venv)
    assert relocated is not None
    first, rest = relocated.split(b"\n", 1)
    assert first == b"#!/opt/rlightning/venv/bin/python"
    compile(rest, "demo", "exec")


def test_a_pip_script_of_a_virtualenv_path_with_a_space_loses_its_shell_trampoline(tmp_path):
    venv = pathlib.Path("/tmp/a clone/.venv")
    script = _pip_script(tmp_path, f"{venv}/bin/python3.11")
    assert script.startswith(b"#!/bin/sh\n")  # what pip writes for such a path
    relocated = _nodeconfig.container_script(script, venv)
    assert relocated is not None
    first, rest = relocated.split(b"\n", 1)
    assert first == b"#!/opt/rlightning/venv/bin/python3.11"
    assert b"exec" not in rest.split(b"\n", 1)[0]
    compile(rest, "demo", "exec")


def test_files_that_do_not_run_the_virtualenvs_python_are_not_scripts(tmp_path):
    venv = pathlib.Path("/w/.venv")
    assert _nodeconfig.container_script(b"# activate\nexport VIRTUAL_ENV=/w/.venv\n", venv) is None
    assert _nodeconfig.container_script(b"#!/bin/sh\necho hi\n", venv) is None
    assert _nodeconfig.container_script(_pip_script(tmp_path, "/other/.venv/bin/python"), venv) is None
    assert _nodeconfig.container_script(b"#!/w/.venv/bin/../../usr/bin/perl\n", venv) is None


def test_this_virtualenvs_entry_points_are_in_the_image_on_path():
    scripts = _realnode.container_scripts()
    assert {"rlightning-operator", "rlightning", "torchrun"} <= set(scripts)
    assert all(data.startswith(b"#!/opt/rlightning/venv/bin/python") for data in scripts.values())
    with tarfile.open(fileobj=io.BytesIO(_images.runtime_layer(scripts))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    operator = members["opt/rlightning/bin/rlightning-operator"]
    assert operator.isfile() and operator.mode == 0o755
    assert members["opt/rlightning"].isdir()
    path = next(entry for entry in _nodeconfig.image_env() if entry.startswith("PATH="))
    assert path.startswith(f"PATH={_nodeconfig.CONTAINER_SCRIPTS}:{_nodeconfig.CONTAINER_VENV}/bin:")


def test_no_host_path_of_the_checkout_or_its_virtualenv_reaches_a_container():
    host = (str(_realnode.repository_root()), str(pathlib.Path(sys.prefix)), str(pathlib.Path(sys.prefix).resolve()))
    assert not [entry for entry in _nodeconfig.image_env() if any(path in entry for path in host)]
    destinations = {str(bind.destination) for bind in _realnode.read_only_binds()}
    assert not destinations & set(host)
    assert {str(_nodeconfig.CONTAINER_SOURCE), str(_nodeconfig.CONTAINER_VENV)} <= destinations
