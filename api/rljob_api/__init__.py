"""rljob_api: the RLJob schema, written once. CRD, chart copy and field reference derive from it."""

from .base import FieldRuleError, Model
from .load import FieldError, RLJobInvalid, load_rljob, parse_rljob
from .placement import Placement, Resources, Toleration, VolumeSource
from .pools import RolloutSpec, SamplingSpec, TrainerSpec
from .reward import (
    DisRMReward,
    GenRMReward,
    RemoteReward,
    ReplicaRange,
    RewardFunction,
    RewardSpec,
    RuleReward,
    ScalingSpec,
)
from .spec import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    AlgorithmSpec,
    CheckpointSpec,
    DataSpec,
    ModelSpec,
    ObjectMeta,
    RLJob,
    RLJobSpec,
    WeightSyncSpec,
)
from .status import PHASES, Condition, PoolReplicas, PoolsStatus, RLJobStatus
from .workercfg import POOLS, WorkerConfigs, derive_worker_configs, pool_resource

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PHASES",
    "PLURAL",
    "POOLS",
    "VERSION",
    "AlgorithmSpec",
    "CheckpointSpec",
    "Condition",
    "DataSpec",
    "DisRMReward",
    "FieldError",
    "FieldRuleError",
    "GenRMReward",
    "Model",
    "ModelSpec",
    "ObjectMeta",
    "Placement",
    "PoolReplicas",
    "PoolsStatus",
    "RLJob",
    "RLJobInvalid",
    "RLJobSpec",
    "RLJobStatus",
    "RemoteReward",
    "ReplicaRange",
    "Resources",
    "RewardFunction",
    "RewardSpec",
    "RolloutSpec",
    "RuleReward",
    "SamplingSpec",
    "ScalingSpec",
    "Toleration",
    "TrainerSpec",
    "VolumeSource",
    "WeightSyncSpec",
    "WorkerConfigs",
    "derive_worker_configs",
    "load_rljob",
    "parse_rljob",
    "pool_resource",
]
