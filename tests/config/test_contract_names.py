"""Names the spec models spell again (Literals, for a clear schema) and the seed's PolicyRole are contract.py's."""

from __future__ import annotations

import typing

import pytest

from rlightning import contract
from rlightning.config import PolicyGroupManifest


@pytest.mark.parametrize(("field", "expected"), [("api_version", contract.GROUP_VERSION), ("kind", contract.KIND)])
def test_manifest_literals_are_the_contract_coordinates(field, expected):
    assert typing.get_args(PolicyGroupManifest.model_fields[field].annotation) == (expected,)


def test_the_seeds_policy_role_is_the_contracts():
    import torch  # rlightning.policy needs it; the other tests here stay free of it

    torch.set_num_threads(1)
    from rlightning.policy import PolicyRole, base_policy

    assert PolicyRole is base_policy.PolicyRole is contract.PolicyRole
    assert {role.name: role.value for role in PolicyRole} == {"TRAIN": "train", "EVAL": "eval"}
