from rljob.v1 import sample_pb2 as _sample_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WeightBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_BACKEND_UNSPECIFIED: _ClassVar[WeightBackend]
    WEIGHT_BACKEND_GLOO: _ClassVar[WeightBackend]
    WEIGHT_BACKEND_NCCL: _ClassVar[WeightBackend]
WEIGHT_BACKEND_UNSPECIFIED: WeightBackend
WEIGHT_BACKEND_GLOO: WeightBackend
WEIGHT_BACKEND_NCCL: WeightBackend

class PromptRequest(_message.Message):
    __slots__ = ("prompt_id", "token_ids", "text", "n", "first_index")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    n: int
    first_index: int
    def __init__(self, prompt_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., n: _Optional[int] = ..., first_index: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "sampling")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[PromptRequest]
    sampling: _sample_pb2.SamplingParams
    def __init__(self, prompts: _Optional[_Iterable[_Union[PromptRequest, _Mapping]]] = ..., sampling: _Optional[_Union[_sample_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("completion", "completions")
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    completion: _sample_pb2.Completion
    completions: _containers.RepeatedCompositeFieldContainer[_sample_pb2.Completion]
    def __init__(self, completion: _Optional[_Union[_sample_pb2.Completion, _Mapping]] = ..., completions: _Optional[_Iterable[_Union[_sample_pb2.Completion, _Mapping]]] = ...) -> None: ...

class JoinWeightGroupRequest(_message.Message):
    __slots__ = ("group_id", "master_address", "master_port", "rank", "world_size", "backend", "timeout_seconds")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    master_address: str
    master_port: int
    rank: int
    world_size: int
    backend: WeightBackend
    timeout_seconds: float
    def __init__(self, group_id: _Optional[str] = ..., master_address: _Optional[str] = ..., master_port: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., backend: _Optional[_Union[WeightBackend, str]] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class JoinWeightGroupResponse(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class TensorMeta(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "numel")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    numel: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., numel: _Optional[int] = ...) -> None: ...

class Bucket(_message.Message):
    __slots__ = ("dtype", "numel", "tensors")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUMEL_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    numel: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    def __init__(self, dtype: _Optional[str] = ..., numel: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ...) -> None: ...

class BroadcastSource(_message.Message):
    __slots__ = ("group_id", "buckets")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    buckets: _containers.RepeatedCompositeFieldContainer[Bucket]
    def __init__(self, group_id: _Optional[str] = ..., buckets: _Optional[_Iterable[_Union[Bucket, _Mapping]]] = ...) -> None: ...

class PullSource(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class UpdateWeightsRequest(_message.Message):
    __slots__ = ("version", "broadcast", "pull")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    version: int
    broadcast: BroadcastSource
    pull: PullSource
    def __init__(self, version: _Optional[int] = ..., broadcast: _Optional[_Union[BroadcastSource, _Mapping]] = ..., pull: _Optional[_Union[PullSource, _Mapping]] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("staged_version", "serving_version", "bytes", "seconds")
    STAGED_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVING_VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    staged_version: int
    serving_version: int
    bytes: int
    seconds: float
    def __init__(self, staged_version: _Optional[int] = ..., serving_version: _Optional[int] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class GetRolloutInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRolloutInfoResponse(_message.Message):
    __slots__ = ("engine", "model", "policy_version", "in_flight", "draining", "eos_token_id", "weight_ranks", "weight_update")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_RANKS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_UPDATE_FIELD_NUMBER: _ClassVar[int]
    engine: str
    model: str
    policy_version: int
    in_flight: int
    draining: bool
    eos_token_id: int
    weight_ranks: int
    weight_update: str
    def __init__(self, engine: _Optional[str] = ..., model: _Optional[str] = ..., policy_version: _Optional[int] = ..., in_flight: _Optional[int] = ..., draining: _Optional[bool] = ..., eos_token_id: _Optional[int] = ..., weight_ranks: _Optional[int] = ..., weight_update: _Optional[str] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("timeout_seconds",)
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    timeout_seconds: float
    def __init__(self, timeout_seconds: _Optional[float] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("in_flight",)
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    def __init__(self, in_flight: _Optional[int] = ...) -> None: ...
