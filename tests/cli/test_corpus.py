"""One validation: `rlightning validate` and the API server give every manifest of the corpus the same verdict.

The corpus (`bad_manifests.CASES`) is fed to the CLI (exit 2 and an `error:` line naming the field, or exit 0)
and, as files, to the suite's real API server with the CRD from crds/ (`kubectl apply --dry-run=server`, kubectl's
default strict field validation). Cases only the CLI's deep checks can judge are accepted by the server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlightning import cli

from bad_manifests import CASES, Case


def _write(case: Case, folder: Path) -> Path:
    path = folder / f"{CASES.index(case):03d}.yaml"
    path.write_bytes(case.content)
    return path


def test_the_corpus_is_large_enough():
    bad = [case for case in CASES if not case.good]
    assert len(bad) >= 50 and sum(case.good for case in CASES) >= 3
    assert len([case for case in bad if not case.cli_only]) >= 50, "at least 50 judged by both"


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_cli_judges_each_manifest(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["validate", str(_write(case, tmp_path))])
    out, err = capsys.readouterr()
    if case.good:
        assert code == 0 and err == "", err
        assert "valid PolicyGroup" in out
        return
    assert code == 2, out + err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors and len(errors) == len(err.splitlines()), err  # every line an error line, no traceback
    assert any(case.field in line for line in errors), f"{case.name}: no error names {case.field!r}:\n{err}"


def test_the_api_server_agrees(crd, namespace, tmp_path: Path) -> None:
    disagreements = []
    for case in CASES:
        result = crd.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(_write(case, tmp_path)),
                             check=False)  # fmt: skip
        accepted = result.returncode == 0
        expected = case.good or bool(case.cli_only)  # the server cannot see what only the CLI's deep checks see
        if accepted != expected:
            said = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["(no output)"]
            disagreements.append(f"{case.name}: server {'accepted' if accepted else 'refused'}: {said[0][:300]}")
    assert not disagreements, "\n".join(disagreements)
