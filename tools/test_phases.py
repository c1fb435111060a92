"""What ``make test`` runs, in phases, timed: the Go builds overlap everything that does not need them.

1. The control plane and the add-ons start compiling in the background (``nice -n 19``, in a session of its own:
   where the kernel's autogroup scheduling is on, as on this machine, a session's nice value counts only within
   it, so the build takes an even share of the CPU beside the tests' session whatever its nice value; log in
   ``build/make-test/go-build.log``); on a warm cache this returns at once.
2. ``make install`` (pip), then ``make lint``.
3. Warm caches (the builds already ended): the whole suite in one parallel session (pytest-xdist, each worker on
   its own devcluster slot; the real node's tests and the autoscalers' are one group each, started first since
   they are the largest). Cold caches: ``pytest -m "not cluster"`` in parallel beside the compiler; once the
   control plane is built (``python -m devcluster build`` waits on the build lock) the cluster tests, with the
   add-ons compiling beside them at normal priority (the add-ons and then the autoscaling tests, not the cluster
   tests, are the longest chain of a cold run); as soon as the add-ons are built, the autoscaling tests in a
   session of their own on the next devcluster slots, beside the cluster tests.

At the end it prints where the time went: each phase's wall time, the Go build's, and per tier (unit, slow,
cluster, autoscaling, realpods) the summed test durations from each phase's JUnit XML, then one closing line
``suite: N passed, N failed, N skipped``. The exit status is 0 only when every phase passed. With ``--record`` it
also appends those figures to docs/measurements.md as one row (``benchmarks/_record.py``), passed or failed.

Stdlib only (it starts before pip has installed anything but PyYAML). Run it as ``make test`` does:
``.venv/bin/python tools/test_phases.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # the repository root, for benchmarks._record: the one writer of docs/measurements.md
from benchmarks import _record  # noqa: E402  (stdlib only, as this script must be)

LOG_DIR = REPO / "build" / "make-test"
ADDONS = ("metrics-server", "karpenter", "keda", "kueue")
"""Every add-on a test uses (tests/autoscaling); built after the control plane, in this order."""
TIERS = ("unit", "slow", "cluster", "autoscaling", "realpods")
"""Test tiers, as tests/conftest.py names them."""


@dataclasses.dataclass
class Phase:
    """One timed step of the run.

    Attributes:
        name (str): Shown in the report.
        seconds (float): Wall time.
        ok (bool): Whether it passed.
        junit (pathlib.Path | None): The pytest phase's JUnit XML report, if it ran pytest.
    """

    name: str
    seconds: float
    ok: bool
    junit: pathlib.Path | None = None


@dataclasses.dataclass
class TierTime:
    """Tests of one tier over the phases' JUnit reports.

    Attributes:
        tests (int): How many ran (skipped ones included).
        seconds (float): Their durations summed (over parallel workers, so above the wall time).
    """

    tests: int = 0
    seconds: float = 0.0


def _run(name: str, command: list[str], phases: list[Phase], junit: pathlib.Path | None = None,
         env: dict[str, str] | None = None) -> bool:
    print(f"\n=== {name}: {shlex.join(command)}", flush=True)
    start = time.monotonic()
    code = subprocess.call(command, cwd=REPO, env=env)
    # pytest's exit code 5 means no test was selected: an empty phase, not a failure.
    ok = code == 0 or (junit is not None and code == 5)
    phases.append(Phase(name, time.monotonic() - start, ok, junit))
    return ok


def _pytest(python: str, name: str, marker: str | None, workers: int, phases: list[Phase], first_slot: int = 0) -> bool:
    """Run one pytest-xdist session; its workers take the devcluster slots from ``first_slot`` on (after the
    environment's ``RLIGHTNING_DEVCLUSTER_SLOT``).
    """
    junit = LOG_DIR / f"{name.replace(' ', '-')}.xml"
    junit.unlink(missing_ok=True)
    selection = ["-m", marker] if marker else []
    command = [python, "-m", "pytest", *selection, "-n", str(workers), "--dist", "loadgroup", f"--junitxml={junit}"]
    base = int(os.environ.get("RLIGHTNING_DEVCLUSTER_SLOT", "0"))
    env = {**os.environ, "RLIGHTNING_DEVCLUSTER_SLOT": str(base + first_slot)} if first_slot else None
    return _run(name, command, phases, junit, env)


def _unnice(builder: subprocess.Popen) -> None:
    """Give the builder's process group (the go commands and their compilers) normal priority; a user who may not
    lower a nice value (not root, no CAP_SYS_NICE) keeps the niced build, with a note.
    """
    try:
        os.setpriority(os.PRIO_PGRP, builder.pid, 0)
    except OSError as error:
        print(f"note: the add-on builds stay niced ({error})", flush=True)


def _cold_phases(python: str, builder: subprocess.Popen, workers: int, phases: list[Phase]) -> None:
    """While the Go builds run: the tests without a cluster, then (control plane built) the cluster tests and,
    beside them as soon as the add-ons are built, the autoscaling tests (one worker: they are one group).
    """
    _pytest(python, "tests without a cluster", "not cluster", workers, phases)
    addons_ready = builder.poll() == 0
    if not _run("control-plane build (wait)", [python, "-m", "devcluster", "build"], phases):
        return
    if addons_ready:
        _pytest(python, "cluster tests", "cluster", workers, phases)
        return
    _unnice(builder)

    def autoscaling_once_built() -> None:
        if builder.wait() == 0:
            _pytest(python, "autoscaling tests", "autoscaling", 1, phases, first_slot=workers)

    beside = threading.Thread(target=autoscaling_once_built)
    beside.start()
    _pytest(python, "cluster tests", "cluster and not autoscaling", workers, phases)
    beside.join()


def _tally(phases: list[Phase]) -> tuple[dict[str, TierTime], dict[str, int]]:
    """Sum test durations per tier and count outcomes over the phases' JUnit reports.

    Each test case carries its tier as the JUnit property ``tier`` (tests/conftest.py records it).
    """
    per_tier = {tier: TierTime() for tier in TIERS}
    outcomes = {"passed": 0, "failed": 0, "skipped": 0}
    for phase in phases:
        if phase.junit is None or not phase.junit.is_file():
            continue
        for case in ElementTree.parse(phase.junit).iter("testcase"):
            if case.find("skipped") is not None:
                outcomes["skipped"] += 1
            elif case.find("failure") is not None or case.find("error") is not None:
                outcomes["failed"] += 1
            else:
                outcomes["passed"] += 1
            tier = next((prop.get("value") for prop in case.iter("property") if prop.get("name") == "tier"), "unit")
            row = per_tier.setdefault(tier or "unit", TierTime())
            row.tests += 1
            row.seconds += float(case.get("time", 0.0))
    return per_tier, outcomes


def _figures(phases: list[Phase], build: Phase | None, total: float, workers: int) -> str:
    """The run's figures as one line for docs/measurements.md: outcomes, each phase's and the build's wall seconds,
    the total in minutes and the workers, e.g. ``1119 passed, 0 failed, 0 skipped; install 0 s, lint 7 s, suite
    798 s, go builds 1 s (background); total 13.5 min, 4 workers``. A failed phase is marked ``FAILED``.
    """
    _, outcomes = _tally(phases)
    timed = [*phases, *([Phase("go builds", build.seconds, build.ok)] if build else [])]
    cells = [f"{phase.name} {phase.seconds:.0f} s" + ("" if phase.ok else " FAILED") for phase in timed]
    if build is not None:
        cells[-1] += " (background)"
    return (f"{outcomes['passed']} passed, {outcomes['failed']} failed, {outcomes['skipped']} skipped; "
            f"{', '.join(cells)}; total {total / 60:.1f} min, {workers} workers")


def _report(phases: list[Phase], build: Phase | None, total: float) -> int:
    per_tier, outcomes = _tally(phases)
    print("\n=== where the time went (wall seconds)")
    for phase in phases:
        print(f"  {phase.name:<28} {phase.seconds:8.0f}  {'ok' if phase.ok else 'FAILED'}")
    if build is not None:
        print(f"  {'go builds (background)':<28} {build.seconds:8.0f}  {'ok' if build.ok else 'FAILED'}")
    print(f"  {'total':<28} {total:8.0f}")
    print("=== test time by tier (summed over parallel workers)")
    for tier, row in per_tier.items():
        print(f"  {tier:<28} {row.seconds:8.0f}  {row.tests} tests")
    print(f"suite: {outcomes['passed']} passed, {outcomes['failed']} failed, {outcomes['skipped']} skipped")
    failed = [phase.name for phase in [*phases, *([build] if build else [])] if not phase.ok]
    if failed:
        print(f"failed phases: {', '.join(failed)}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Run the phases (see the module docstring); return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=int(os.environ.get("RLIGHTNING_TEST_WORKERS", "4")),
                        help="pytest-xdist workers per phase (default $RLIGHTNING_TEST_WORKERS or 4; at most 5, "
                        "each cluster worker takes a devcluster slot)")
    parser.add_argument("--make", default=os.environ.get("MAKE", "make"), help="the make command (default $MAKE)")
    parser.add_argument("--record", action="store_true", help=_record.RECORD_HELP)
    args = parser.parse_args(argv)
    python = sys.executable
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    phases: list[Phase] = []

    def finish(build: Phase | None) -> int:
        total = time.monotonic() - start
        status = _report(phases, build, total)
        if args.record:
            print(f"recorded: {_record.append_row(_figures(phases, build, total, args.workers))}")
        return status

    build_log = LOG_DIR / "go-build.log"
    addon_flags = [flag for name in ADDONS for flag in ("--addon", name)]
    print(f"=== go builds in the background (niced; log {build_log.relative_to(REPO)})", flush=True)
    with open(build_log, "w") as log:
        # a session (so a process group) of its own: its priority can be raised once the cluster tests start
        # (`_unnice`); under autogroup scheduling the session shares the CPU evenly with the tests' session
        builder = subprocess.Popen(["nice", "-n", "19", python, "-m", "devcluster", "build", *addon_flags],
                                   cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    build_end: list[float] = []

    def note_build_end() -> None:
        builder.wait()
        build_end.append(time.monotonic())

    waiter = threading.Thread(target=note_build_end, daemon=True)
    waiter.start()
    build: Phase | None = None
    try:
        ok = _run("install", [args.make, "--no-print-directory", "install"], phases)
        ok = ok and _run("lint", [args.make, "--no-print-directory", "lint"], phases)
        if not ok:
            return finish(None)
        if builder.poll() == 0:
            # Warm caches: one parallel session, so the real node's and the autoscalers' groups start at once.
            _pytest(python, "suite", None, args.workers, phases)
        else:
            _cold_phases(python, builder, args.workers, phases)
        waiter.join()
        build = Phase("go builds", build_end[0] - start, builder.returncode == 0)
        if not build.ok:
            print(f"\nthe Go builds failed (exit {builder.returncode}); the tail of {build_log}:")
            print("\n".join(build_log.read_text().splitlines()[-30:]))
    finally:
        if builder.poll() is None:  # interrupted: stop the go commands too (they are in the builder's group)
            os.killpg(builder.pid, signal.SIGTERM)
            builder.wait()
    return finish(build)


if __name__ == "__main__":
    sys.exit(main())
