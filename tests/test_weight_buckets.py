"""The checkpoint engine's buckets: plans, packing, the proto form, dtype names, and the publisher's buffers."""

from __future__ import annotations

import pytest
import torch
from weight_helpers import BUCKET_BYTES, assert_same, small_model

from rljob.v1 import rollout_service_pb2 as pb
from rljob_workers.weights import (
    WeightPublisher,
    from_proto,
    pack,
    plan_buckets,
    plan_for,
    to_proto,
    unpack,
)
from rljob_workers.weights.buckets import dtype_from_name, dtype_name


def test_plan_groups_one_dtype_per_bucket_in_state_dict_order():
    model = small_model(0)
    plans = plan_for(model.items(), BUCKET_BYTES)
    names = [slot.name for plan in plans for slot in plan.tensors]
    assert sorted(names) == sorted(model)
    order = list(model)
    firsts = [order.index(plan.tensors[0].name) for plan in plans]
    assert firsts == sorted(firsts)
    for plan in plans:
        assert {slot.dtype for slot in plan.tensors} == {plan.dtype}
        assert plan.nbytes <= BUCKET_BYTES or len(plan.tensors) == 1
        assert [order.index(s.name) for s in plan.tensors] == sorted(order.index(s.name) for s in plan.tensors)
    big = next(plan for plan in plans if plan.tensors[0].name == "big.weight")
    assert len(big.tensors) == 1 and big.nbytes == 64 * 32 * 4
    # The two float32 norms share a bucket although bfloat16 and the big tensor come between them.
    assert any({"layer0.norm", "layer1.norm"} <= {s.name for s in plan.tensors} for plan in plans)


def test_a_full_bucket_closes_and_the_next_one_starts():
    specs = [("a", torch.float32, (3,)), ("b", torch.float32, (3,)), ("c", torch.float32, (2,))]
    plans = plan_buckets(specs, 20)
    assert [[s.name for s in p.tensors] for p in plans] == [["a"], ["b", "c"]]
    assert [(s.offset, s.numel) for s in plans[1].tensors] == [(0, 3), (3, 2)]
    assert plans[1].nbytes == 20


def test_pack_unpack_round_trip_gives_views():
    model = small_model(1)
    plans = plan_for(model.items(), BUCKET_BYTES)
    got: dict[str, torch.Tensor] = {}
    for plan in plans:
        flat = pack(plan, model)
        views = unpack(plan, flat)
        assert all(v.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for v in views.values())
        got.update(views)
    assert_same({name: got[name] for name in model}, model)


def test_pack_refuses_a_tensor_that_does_not_match_the_plan():
    model = small_model(0)
    plan = plan_for(model.items(), BUCKET_BYTES)[0]
    with pytest.raises(ValueError, match=r"embed\.weight"):
        pack(plan, {**model, "embed.weight": torch.zeros(40, 16)})
    with pytest.raises(KeyError, match=r"embed\.weight"):
        pack(plan, {})


def test_plan_survives_the_proto_round_trip():
    plans = plan_for(small_model(0).items(), BUCKET_BYTES)
    wire = [pb.Bucket.FromString(to_proto(p).SerializeToString()) for p in plans]
    assert [from_proto(b) for b in wire] == plans
    assert wire[0].dtype == "bfloat16" and wire[0].tensors[0].name == "embed.weight"


def test_inconsistent_proto_plans_are_refused():
    good = to_proto(plan_for(small_model(0).items(), BUCKET_BYTES)[0])
    bad_numel = pb.Bucket(dtype=good.dtype, numel=1, tensors=good.tensors)
    bad_dtype = pb.Bucket(dtype="float32", numel=good.numel, tensors=good.tensors)
    unknown = pb.Bucket(dtype="float99", numel=good.numel)
    for message, match in [(bad_numel, "too small"), (bad_dtype, "inside a float32"), (unknown, "float99")]:
        with pytest.raises(ValueError, match=match):
            from_proto(message)


def test_dtype_names_are_torch_names_without_prefix():
    assert dtype_name(torch.bfloat16) == "bfloat16"
    assert dtype_from_name("float8_e4m3fn") is torch.float8_e4m3fn
    for bad in ["Tensor", "", "_C"]:
        with pytest.raises(ValueError):
            dtype_from_name(bad)


# --- publisher -----------------------------------------------------------------------------


def test_publish_recycles_buffers_only_when_no_stream_holds_them():
    publisher = WeightPublisher(BUCKET_BYTES)
    for version in (1, 2):
        publisher.publish(version, small_model(version).items())
    with publisher.acquire() as v2:
        v2_ptrs = [b.data_ptr() for b in v2.buckets]
        publisher.publish(3, small_model(3).items())  # v1 is free: its buffers are reused
        publisher.publish(4, small_model(4).items())  # v2 is held: fresh buffers, v2 untouched
        with publisher.acquire(4) as v4:
            assert not {b.data_ptr() for b in v4.buckets} & set(v2_ptrs)
        assert {slot.name: flat for slot, flat in v2.tensors()}["big.weight"].equal(
            small_model(2)["big.weight"].view(-1)
        )
    with publisher.acquire() as v4:
        v4_ptrs = [b.data_ptr() for b in v4.buckets]
    publisher.publish(5, small_model(5).items())
    with publisher.acquire() as v5:
        assert v5.version == 5 and [b.data_ptr() for b in v5.buckets] != v4_ptrs


def test_publish_refuses_old_versions_and_other_parameters():
    publisher = WeightPublisher(BUCKET_BYTES)
    with pytest.raises(RuntimeError, match="no version published"):
        _ = publisher.plan
    publisher.publish(3, small_model(0).items())
    with pytest.raises(ValueError, match="not newer"):
        publisher.publish(3, small_model(0).items())
    with pytest.raises(ValueError, match="differ"):
        publisher.publish(4, {**small_model(0), "extra": torch.zeros(1)}.items())


# --- gloo broadcast across processes ---------------------------------------------------------
