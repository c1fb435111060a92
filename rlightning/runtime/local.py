"""The local launcher behind `rlightning run`: the pods of a PolicyGroup as processes on this machine.

Trainers run under `torchrun` (one node, `train.world_size` ranks, static rendezvous on 127.0.0.1 at
`spec.ports.torchrun`); each evaluator is a process of its own. torchrun's agent and the evaluators first start
as forks of this process (`_fork`), which share the modules the launcher's checks imported, and the agent forks
the ranks (`rlightning.runtime.torchrun`, `launch.FORK_RANKS`). Their argv,
environment and grace period come from the launch plan the operator puts into pods (`rlightning.launch`), at a
local `LaunchSite`: the very entrypoints pods run (`rlightning.runtime.train`, `rlightning.runtime.eval`), the
same ENV_* variables. Every port of the run (rendezvous, weight-sync store, trajectory intakes, gloo's sockets)
binds 127.0.0.1 only (`LaunchSite.bind_host`): nothing on the network reaches a local run.

Supervision, as a cluster would do it:
- The trainer ending with exit code 0 ends the run; the evaluators are then stopped with SIGTERM.
- The trainer dying (non-zero exit) stops the evaluators; the run fails with the exit code and its log tail.
- A dead evaluator is restarted with the same ordinal, as its StatefulSet would; the trainer drops it from
  weight sync until it is back. After `eval_restarts` restarts of one evaluator the run fails.
- Ctrl-C (SIGINT) or SIGTERM asks the trainer to stop (it checkpoints and writes summary.json), then stops
  the evaluators; a second Ctrl-C kills everything at once. A child still running after its plan's grace
  period (a pod's terminationGracePeriodSeconds) is killed.

Every child runs in a session of its own (so the terminal's Ctrl-C reaches only the launcher) and logs to
`<run dir>/logs/<name>.log`. Its resolver asks again after 1 s when a DNS reply is lost (`RES_OPTIONS`, unless
set: `launch.LOCAL_RESOLVER_OPTIONS`): c10d names each end of every weight-sync store connection with a reverse
lookup, locally of `::ffff:127.0.0.1`, which no /etc/hosts names, and a reply lost under a burst of them (8
evaluators opening their connections at once) cost glibc's default 5 s on every start (docs/weight-sync.md, "The
store and DNS").

Before forking, the launcher imports what the children's entrypoints import (`_fork.preload`: the evaluator's, the
agent's and the ranks'), once, instead of once in each child.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rlightning import contract, launch
from rlightning.config import PolicyGroupManifest
from rlightning.runtime import _fork, _startup, _tensorboard
from rlightning.runtime import progress as progress_mod
from rlightning.runtime.report import plot_returns
from rlightning.runtime.rundir import JsonlTail, RunDir, read_jsonl

TRAINER = "trainer"
POLL_SECONDS = 0.25
"""How often the launcher polls its children and the metrics file."""
MASTER_ADDR = contract.LOOPBACK_HOST
"""Trainer rank 0's host, and the address every port of the run binds: this machine, on loopback."""
LOG_TAIL_LINES = 25


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ("" when missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Child:
    """One supervised child process.

    Attributes:
        name (str): `trainer` or `eval-<ordinal>`.
        command (list[str]): argv.
        env (dict[str, str]): Its environment.
        log_path (Path): Its stdout and stderr.
        grace_seconds (float): Grace after SIGTERM before SIGKILL, in seconds.
        fork (bool): `command` is `python -m MODULE ARGS` with this interpreter, on a platform that forks
            (`_fork.available`): its first start is a fork of this process (`_fork.ForkedModule`), which shares
            the modules the launcher imported. Restarts come mid-run, when the launcher may run other threads (the
            live view's), and a fork copies only the calling thread: they exec `command`.
        restarts (int): Times it was restarted.
    """

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    grace_seconds: float
    fork: bool = False
    restarts: int = 0
    popen: subprocess.Popen | _fork.ForkedModule | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> int:
        """Start (or restart) the process in a new session, appending to its log.

        Returns:
            int: The process id (also its process group's: a new session).
        """
        self._close_log()
        self._log = self.log_path.open("ab")
        forked = self.fork and not self.restarts
        if forked:
            self.popen = _fork.ForkedModule(self.command[2], self.command[3:], self.env, self._log.fileno())
        else:
            self.popen = subprocess.Popen(
                self.command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        how = " (a fork of the launcher)" if forked else ""
        header = f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} pid {self.popen.pid}{how}: {' '.join(self.command)}\n"
        self._log.write(header.encode())
        self._log.flush()
        return self.popen.pid

    def forked_modules(self) -> list[str]:
        """The modules its first start runs as forks: its own, and its ranks' when torchrun forks them
        (`launch.FORK_RANKS`: the module after torchrun's last `-m`); none when it does not fork.
        """
        if not self.fork:
            return []
        modules = [self.command[2]]
        if launch.FORK_RANKS in self.command:
            last = max(i for i, arg in enumerate(self.command) if arg == "-m")
            modules.append(self.command[last + 1])
        return modules

    def poll(self) -> int | None:
        """Exit code, or None while running (or never started)."""
        return None if self.popen is None else self.popen.poll()

    def signal(self, signum: int) -> None:
        """Send `signum` to the child's process group (it and what it started, e.g. torchrun's ranks)."""
        if self.popen is not None and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signum)
            except ProcessLookupError:
                pass

    def stop(self, grace_seconds: float) -> int | None:
        """SIGTERM, wait up to `grace_seconds`, then SIGKILL. Returns the exit code."""
        if self.popen is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(timeout=10)
        # Whatever the leader left in its group (torchrun's ranks when torchrun itself died) goes too.
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._close_log()
        return self.popen.returncode

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class LocalRun:
    """Runs one PolicyGroup locally until the trainer ends, fails or the user interrupts.

    Args:
        manifest (PolicyGroupManifest): A validated manifest.
        manifest_text (str): Its file's text, copied into the run directory for the children to read.
        run_dir (RunDir): The run directory (created if missing; an existing one is resumed from).
        plain (bool | None, optional): Plain progress lines (True), the live panel (False), or decide by
            whether stdout is a terminal (None). Defaults to None.
        eval_restarts (int, optional): Restarts allowed per evaluator before the run fails. Defaults to 3.
        python (str, optional): Interpreter for the children. Defaults to sys.executable.
        fork (bool, optional): Start the children that run this interpreter as forks of this process (they share
            its imports), where `_fork.available()`. Only for a process whose threads are all known, as `rlightning
            run`'s is: a fork copies one thread, and a lock that another thread held stays held in the child. An
            embedding process (a notebook, a test runner) may run native threads that nothing here can see, so it
            gets plain subprocesses. Defaults to False.
    """

    def __init__(
        self,
        manifest: PolicyGroupManifest,
        manifest_text: str,
        run_dir: RunDir,
        plain: bool | None = None,
        eval_restarts: int = 3,
        python: str = sys.executable,
        fork: bool = False,
    ) -> None:
        self.manifest = manifest
        self.manifest_text = manifest_text
        self.run_dir = run_dir
        self.plain = plain
        self.eval_restarts = eval_restarts
        self.python = python
        self.fork = fork
        self._interrupts = 0
        self._started_at = 0.0
        # The launch: this process's start (its imports and checks count), the children measure from it.
        self.launched_at = _startup.process_start_time() or time.time()

    # -- what the children are --------------------------------------------------------------------------
    def launch_site(self) -> launch.LaunchSite:
        """This machine as the site of the launch plans: trainer rank 0 on loopback, all trainer ranks on one
        node, the run directory's spec, no metrics endpoints (they would share a port), the trainer told of
        the `eval.replicas` evaluators this launcher starts, and every port bound on loopback only.
        """
        return launch.LaunchSite(
            python=self.python,
            master_addr=MASTER_ADDR,
            trainer_hosts=(MASTER_ADDR,),
            spec_path=str(self.run_dir.spec_path.resolve()),
            run_dir=str(self.run_dir.root.resolve()),
            node_rank=None,
            metrics=False,
            expected_evaluators=self.manifest.spec.eval.replicas,
            in_pod=False,
            bind_host=MASTER_ADDR,
        )

    def child_env(self, plan: launch.LaunchPlan) -> dict[str, str]:
        """The environment of a child: this process's, without variables the runtime reads, plus the plan's.

        Args:
            plan (launch.LaunchPlan): The child's launch plan.

        Returns:
            dict[str, str]: The environment; OMP_NUM_THREADS defaults to 1 (the children share this machine's
                cores) and RES_OPTIONS to `launch.LOCAL_RESOLVER_OPTIONS` (module docstring), output is unbuffered
                (the logs follow the run), and `ENV_LAUNCH_TIME` is this launch's.
        """
        env = {name: value for name, value in os.environ.items() if name not in launch.RUNTIME_ENV}
        env.update(plan.env)
        env[contract.ENV_LAUNCH_TIME] = f"{self.launched_at:.3f}"
        env.setdefault(launch.THREADS_ENV, "1")
        env.setdefault(launch.RESOLVER_ENV, launch.LOCAL_RESOLVER_OPTIONS)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def child(self, name: str, role: contract.PolicyRole, ordinal: int | None = None) -> Child:
        """The child `name` of `role`, from its launch plan."""
        plan = launch.plan(self.manifest, role, self.launch_site(), ordinal)
        log_path = self.run_dir.logs_dir / f"{name}.log"
        # torchrun's agent and the evaluators share our imports
        fork = self.fork and plan.argv[:2] == (sys.executable, "-m") and _fork.available()
        return Child(name, list(plan.argv), self.child_env(plan), log_path, plan.grace_seconds, fork)

    def children(self) -> list[Child]:
        """Evaluators first (they wait for the trainer's store), then the trainer."""
        evals = [
            self.child(f"eval-{i}", contract.PolicyRole.EVAL, i) for i in range(self.manifest.spec.eval.replicas)
        ]
        return [*evals, self.child(TRAINER, contract.PolicyRole.TRAIN)]

    # -- running ----------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: object) -> None:
        del signum, frame
        self._interrupts += 1

    def run(self) -> int:
        """Start the children, show progress, supervise, and clean up.

        Returns:
            int: 0 when the trainer finished, 1 when a child failed, 130 when interrupted.
        """
        self.run_dir.create()
        self.run_dir.spec_path.write_text(self.manifest_text)
        self.run_dir.error_path.unlink(missing_ok=True)  # a previous run's: the trainer's ranks write the first one
        spec = self.manifest.spec
        children = self.children()
        trainer = children[-1]
        evals = children[:-1]
        old_handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        title = f"rlightning run {self.manifest.metadata.name}  ->  {self.run_dir.root}"
        view = progress_mod.make_progress(title, spec.train.total_env_steps, spec.train.target_eval_return, self.plain)
        tail = JsonlTail(self.run_dir.metrics_path)
        tail.read_new()  # a resumed run shows only its own rows
        started = time.monotonic()
        self._started_at = time.time()
        try:
            _fork.preload(module for child in children for module in child.forked_modules())
            pids = [child.start() for child in children]  # before the view starts a thread: see `Child.fork`
            with view:
                for child, pid in zip(children, pids, strict=True):
                    view.message(f"started {child.name} (pid {pid}), log {child.log_path}")
                if _tensorboard.available():
                    view.message(_tensorboard.logdir_hint(self.run_dir.tensorboard_dir))
                code = self._supervise(trainer, evals, view, tail)
                view.update(tail.read_new(), self._states(children))
        finally:
            self._stop_all(trainer, evals)
            for signum, handler in old_handlers.items():
                signal.signal(signum, handler)
        plot_returns(read_jsonl(self.run_dir.metrics_path), self.run_dir.plot_path, self.manifest.metadata.name)
        self._print_outcome(code, time.monotonic() - started)
        return code

    def _states(self, children: list[Child]) -> dict[str, str]:
        states = {}
        for child in children:
            code = child.poll()
            states[child.name] = "running" if code is None else f"exited {code}"
        return states

    def _supervise(self, trainer: Child, evals: list[Child], view: progress_mod.View, tail: JsonlTail) -> int:
        interrupted_at: float | None = None
        while True:
            view.update(tail.read_new(), self._states([*evals, trainer]))
            if self._interrupts and interrupted_at is None:
                view.message("interrupted: asking the trainer to checkpoint and stop (Ctrl-C again to kill)")
                trainer.signal(signal.SIGTERM)
                interrupted_at = time.monotonic()
            if self._interrupts > 1 or (interrupted_at and time.monotonic() - interrupted_at > trainer.grace_seconds):
                view.message("killing every child process")
                return 130
            code = trainer.poll()
            if code is not None:
                if interrupted_at is not None:
                    return 130
                if code == 0:
                    return 0
                self._report_failure(view, trainer, code)
                return 1
            for child in evals:
                code = child.poll()
                if code is None or interrupted_at is not None:
                    continue
                if child.restarts >= self.eval_restarts:
                    self._report_failure(view, child, code)
                    return 1
                child.restarts += 1
                view.message(
                    f"{child.name} exited with code {code}; restarting it "
                    f"({child.restarts}/{self.eval_restarts}), log {child.log_path}"
                )
                child.start()
            time.sleep(POLL_SECONDS)

    def _report_failure(self, view: progress_mod.View, child: Child, code: int) -> None:
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        own = self._rank_error() if child.name == TRAINER else ""
        if own:  # the failing rank's own exception first, not torchrun's banner at the end of the log
            view.message(f"error: {child.name} failed with {how}: {own}")
        view.message(f"error: {child.name} failed with {how}; stopping the others. Last lines of {child.log_path}:")
        view.message(log_tail(child.log_path) or "(empty log)")

    def _rank_error(self) -> str:
        """What the first failing trainer rank wrote (`rlightning.runtime._errors`); "" when none did."""
        try:
            return self.run_dir.error_path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return ""

    def _stop_all(self, trainer: Child, evals: list[Child]) -> None:
        kill_now = self._interrupts > 1
        trainer.stop(0.0 if kill_now else trainer.grace_seconds)
        for child in evals:
            child.signal(signal.SIGTERM)
        for child in evals:
            child.stop(0.0 if kill_now else child.grace_seconds)

    def _print_outcome(self, code: int, seconds: float) -> None:
        out = sys.stdout if code == 0 else sys.stderr
        summary_path = self.run_dir.summary_path
        if summary_path.exists() and summary_path.stat().st_mtime >= self._started_at:  # not a previous run's
            summary = json.loads(summary_path.read_text())
            sync = summary.get("sync", {})
            reason = summary.get("consistent_reason")
            print(
                f"{'finished' if code == 0 else 'stopped'} in {seconds:.0f} s ({summary.get('stop_reason')}): "
                f"eval return {summary.get('final_eval_return')} on version {summary.get('final_eval_version')}, "
                f"weight version {summary.get('weight_version')}, consistent {summary.get('consistent')}"
                f"{f' ({reason})' if reason else ''}, "
                f"{sync.get('count', 0)} syncs, {sync.get('bytes', 0)} bytes, {sync.get('seconds', 0.0):.2f} s",
                file=out,
            )
            if summary.get("final_eval_note"):  # the final weights went unevaluated: say why
                print(f"note: {summary['final_eval_note']}", file=out)
            phases = summary.get("startup_seconds") or {}
            if phases:  # summary.json's keys are sorted by name: show them in the order they were reached
                ordered = sorted(phases.items(), key=lambda item: item[1])
                marks = ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in ordered)
                print(f"start-up, seconds from launch: {marks}", file=out)
            dropped = summary.get("dropped")
            if dropped:
                reasons = ", ".join(f"{reason} {count}" for reason, count in dropped["reasons"].items())
                print(f"dropped {dropped['share']:.1%} of the fleet's batches: {reasons}", file=out)
        print(f"run directory: {self.run_dir.root}", file=out)
        if self.run_dir.tensorboard_dir.is_dir():
            print(_tensorboard.logdir_hint(self.run_dir.tensorboard_dir), file=out)


def run_local(
    manifest: PolicyGroupManifest,
    manifest_path: Path,
    run_dir: Path,
    plain: bool | None = None,
    eval_restarts: int = 3,
) -> int:
    """Run a validated manifest locally (what `rlightning run` does after validation).

    Args:
        manifest (PolicyGroupManifest): The validated manifest.
        manifest_path (Path): Its file, copied into the run directory.
        run_dir (Path): The run directory.
        plain (bool | None, optional): See `LocalRun`. Defaults to None.
        eval_restarts (int, optional): See `LocalRun`. Defaults to 3.

    Returns:
        int: The launcher's exit code (0 finished, 1 a child failed, 130 interrupted).
    """
    text = manifest_path.read_text(encoding="utf-8")
    return LocalRun(manifest, text, RunDir(run_dir), plain, eval_restarts, fork=True).run()
