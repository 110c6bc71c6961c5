"""The checkpoint engine: versioned, bucketed weight transfer from the trainer to rollout replicas.

Trainer (rank 0)::

    publisher = WeightPublisher()
    store = host_store(host)                      # send store.port in JoinWeightGroup
    group = WeightGroup.create(gid, host, store.port, 0, world_size, store=store)
    publisher.publish(version, model.named_parameters(), group)   # pack + broadcast, overlapped
    # serve weight_service(publisher) for replicas that pull

Rollout replica::

    group = WeightGroup.from_request(join_request)
    tensors = receive_broadcast(group, [from_proto(b) for b in update.broadcast.buckets])
    version, tensors = await pull_weights(update.pull.address, min_version)
"""

from rljob_workers.weights.buckets import (
    BucketPlan,
    TensorSlot,
    empty_buckets,
    from_proto,
    pack,
    plan_buckets,
    plan_for,
    to_proto,
    unpack,
)
from rljob_workers.weights.group import WeightGroup, host_store
from rljob_workers.weights.publisher import NoVersionError, WeightPublisher, WeightServicer, as_service, weight_service
from rljob_workers.weights.receiver import WeightStreamError, pull_weights, receive_broadcast

__all__ = [
    "BucketPlan",
    "NoVersionError",
    "TensorSlot",
    "WeightGroup",
    "WeightPublisher",
    "WeightServicer",
    "WeightStreamError",
    "as_service",
    "empty_buckets",
    "from_proto",
    "host_store",
    "pack",
    "plan_buckets",
    "plan_for",
    "pull_weights",
    "receive_broadcast",
    "to_proto",
    "unpack",
    "weight_service",
]
