"""Names spelled twice on purpose (a Literal for a clear schema, an enum for the runtime) agree with contract.py."""

from __future__ import annotations

import typing

import pytest

from rlightning import contract
from rlightning.config import PolicyGroupManifest


@pytest.mark.parametrize(("field", "expected"), [("api_version", contract.GROUP_VERSION), ("kind", contract.KIND)])
def test_manifest_literals_are_the_contract_coordinates(field, expected):
    assert typing.get_args(PolicyGroupManifest.model_fields[field].annotation) == (expected,)


def test_policy_roles_are_the_contract_roles():
    import torch  # rlightning.policy needs it; the other tests here stay free of it

    torch.set_num_threads(1)
    from rlightning.policy import PolicyRole

    assert {role.name: role.value for role in PolicyRole} == {"TRAIN": contract.ROLE_TRAIN, "EVAL": contract.ROLE_EVAL}
