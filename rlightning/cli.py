"""The `rlightning` command: run a PolicyGroup locally, validate manifests, print the CRD, manage a dev cluster.

```
rlightning run FILE [--run-dir DIR] [--plain]   train and evaluate locally (torchrun + evaluator processes)
rlightning validate FILE...                     structural and deep checks; exit 2 with one line per problem
rlightning crd [--output FILE]                  the PolicyGroup CRD as YAML
rlightning dev cluster up|down                  a local control plane (the devcluster package)
```
Exit codes: 0 success, 1 a run failed, 2 an invalid manifest or usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

from rlightning.config import ManifestError, PolicyGroupManifest
from rlightning.contract import EXIT_BAD_MANIFEST


def _validated(path: Path) -> PolicyGroupManifest | None:
    """Validate `path`, printing `error: <path>: <rule>` lines to stderr; None when invalid."""
    from rlightning.runtime.validate import validate_file

    try:
        return validate_file(path)
    except ManifestError as error:
        for problem in error.problems:
            print(f"error: {problem}", file=sys.stderr)
        return None


def _cmd_validate(args: argparse.Namespace) -> int:
    from rlightning.runtime.validate import PAUSED_FLEET_NOTE, paused_fleet

    code = 0
    for path in args.files:
        manifest = _validated(path)
        if manifest is None:
            code = EXIT_BAD_MANIFEST
            continue
        spec = manifest.spec
        print(
            f"{path}: valid PolicyGroup {manifest.metadata.name!r} ({spec.env.id}, {spec.policy.policy_class}, "
            f"{spec.train.world_size} trainer rank(s), {spec.eval.replicas} evaluator(s))"
        )
        if paused_fleet(manifest):
            print(f"note: {PAUSED_FLEET_NOTE}")
    return code


def _cmd_run(args: argparse.Namespace) -> int:
    from rlightning.runtime.validate import PAUSED_FLEET_LOCAL, paused_fleet, pod_only_notes

    manifest = _validated(args.file)
    if manifest is None:
        return EXIT_BAD_MANIFEST
    for note in pod_only_notes(manifest):
        print(f"note: {note}")
    if paused_fleet(manifest):
        print(f"error: {PAUSED_FLEET_LOCAL}", file=sys.stderr)
        return EXIT_BAD_MANIFEST
    from rlightning.runtime.local import run_local
    from rlightning.runtime.rundir import default_run_dir

    run_dir = args.run_dir or default_run_dir(manifest.metadata.name)
    return run_local(manifest, args.file, run_dir, plain=True if args.plain else None, eval_restarts=args.eval_restarts)


def _cmd_crd(args: argparse.Namespace) -> int:
    from rlightning.config import crd_yaml

    text = crd_yaml()
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        print(f"wrote {args.output}")
    return 0


def _cmd_dev_cluster(args: argparse.Namespace) -> int:
    argv = sys.argv
    sys.argv = ["devcluster", args.action, *args.args]
    try:
        runpy.run_module("devcluster", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        sys.argv = argv
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `rlightning` (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(prog="rlightning", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="train and evaluate a PolicyGroup manifest on this machine")
    run.add_argument("file", type=Path, help="PolicyGroup manifest (YAML)")
    run.add_argument("--run-dir", type=Path, default=None, help="run directory (default runs/<name>-<UTC time>)")
    run.add_argument("--plain", action="store_true", help="print plain progress lines instead of the live panel")
    run.add_argument(
        "--eval-restarts", type=int, default=3, help="restarts allowed per dead evaluator before the run fails"
    )
    run.set_defaults(handler=_cmd_run)

    validate = commands.add_parser("validate", help="check manifests (exit 2 with one line per problem)")
    validate.add_argument("files", type=Path, nargs="+", metavar="FILE", help="PolicyGroup manifest (YAML)")
    validate.set_defaults(handler=_cmd_validate)

    crd = commands.add_parser("crd", help="print the PolicyGroup CustomResourceDefinition as YAML")
    crd.add_argument("--output", "-o", type=Path, default=None, help="write to this file instead of stdout")
    crd.set_defaults(handler=_cmd_crd)

    dev = commands.add_parser("dev", help="development helpers")
    dev_commands = dev.add_subparsers(dest="dev_command", required=True, metavar="COMMAND")
    cluster = dev_commands.add_parser("cluster", help="a local control plane (kube-apiserver, etcd, kwok)")
    cluster.add_argument("action", choices=["up", "down"])
    cluster.add_argument("args", nargs=argparse.REMAINDER, help="passed on to `python -m devcluster ACTION`")
    cluster.set_defaults(handler=_cmd_dev_cluster)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rlightning` console script.

    Args:
        argv (list[str] | None, optional): Arguments without the program name; defaults to sys.argv[1:].

    Returns:
        int: The exit code.
    """
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
