"""L2 fingerprints (tolerant) and digests (exact)."""

from __future__ import annotations

import torch

from rlightning.weights import l2_fingerprint, mismatched_digests, mismatched_fingerprints, tensor_digests

torch.set_num_threads(1)


def test_l2_fingerprint_is_float32_norm():
    state = {"w": torch.tensor([3.0, 4.0], dtype=torch.float64), "n": torch.tensor(2, dtype=torch.int64)}
    assert l2_fingerprint(state) == {"w": 5.0, "n": 2.0}


def test_digest_detects_one_ulp_and_dtype_or_shape_changes():
    w = torch.randn(4, 4)
    nudged = w.clone()
    nudged[1, 2] = torch.nextafter(nudged[1, 2], torch.tensor(float("inf")))
    base = tensor_digests({"w": w})
    assert tensor_digests({"w": w.clone()}) == base
    assert tensor_digests({"w": nudged}) != base
    assert mismatched_fingerprints(l2_fingerprint({"w": w}), l2_fingerprint({"w": nudged})) == []  # within rtol
    assert mismatched_digests(base, tensor_digests({"w": nudged})) == ["w"]
    same_bytes = w.view(torch.int32)
    assert tensor_digests({"w": same_bytes}) != base
    assert tensor_digests({"w": w.reshape(2, 8)}) != base
    assert tensor_digests({"w": w.t().contiguous().t()}) == base  # C-order bytes, layout-independent
    assert tensor_digests({"b": torch.ones(3, dtype=torch.bfloat16)})["b"]  # no numpy bfloat16 needed


def test_mismatch_helpers_name_differences_and_one_sided_names():
    a = {"x": 1.0, "y": 2.0, "only_a": 0.0}
    b = {"x": 1.0 + 1e-7, "y": 2.1, "only_b": 0.0}
    assert mismatched_fingerprints(a, b, rtol=1e-5) == ["only_a", "only_b", "y"]
    assert mismatched_digests({"x": "1", "y": "2"}, {"x": "1", "y": "3"}) == ["y"]
