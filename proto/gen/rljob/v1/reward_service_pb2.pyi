from rljob.v1 import sample_pb2 as _sample_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreRequest(_message.Message):
    __slots__ = ("sample", "samples")
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    sample: _sample_pb2.RewardSample
    samples: _containers.RepeatedCompositeFieldContainer[_sample_pb2.RewardSample]
    def __init__(self, sample: _Optional[_Union[_sample_pb2.RewardSample, _Mapping]] = ..., samples: _Optional[_Iterable[_Union[_sample_pb2.RewardSample, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("score", "scores")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    score: _sample_pb2.SampleScore
    scores: _containers.RepeatedCompositeFieldContainer[_sample_pb2.SampleScore]
    def __init__(self, score: _Optional[_Union[_sample_pb2.SampleScore, _Mapping]] = ..., scores: _Optional[_Iterable[_Union[_sample_pb2.SampleScore, _Mapping]]] = ...) -> None: ...

class ScoreBatchRequest(_message.Message):
    __slots__ = ("samples",)
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[_sample_pb2.RewardSample]
    def __init__(self, samples: _Optional[_Iterable[_Union[_sample_pb2.RewardSample, _Mapping]]] = ...) -> None: ...

class ScoreBatchResponse(_message.Message):
    __slots__ = ("scores",)
    SCORES_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[_sample_pb2.SampleScore]
    def __init__(self, scores: _Optional[_Iterable[_Union[_sample_pb2.SampleScore, _Mapping]]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("name", "version", "max_batch_size", "max_in_flight", "min_score", "max_score", "functions", "max_samples_per_message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MIN_SCORE_FIELD_NUMBER: _ClassVar[int]
    MAX_SCORE_FIELD_NUMBER: _ClassVar[int]
    FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLES_PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    max_batch_size: int
    max_in_flight: int
    min_score: float
    max_score: float
    functions: _containers.RepeatedScalarFieldContainer[str]
    max_samples_per_message: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., max_batch_size: _Optional[int] = ..., max_in_flight: _Optional[int] = ..., min_score: _Optional[float] = ..., max_score: _Optional[float] = ..., functions: _Optional[_Iterable[str]] = ..., max_samples_per_message: _Optional[int] = ...) -> None: ...
