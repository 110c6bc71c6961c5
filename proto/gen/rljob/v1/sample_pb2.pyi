from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]

class ErrorClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CLASS_UNSPECIFIED: _ClassVar[ErrorClass]
    ERROR_CLASS_INVALID: _ClassVar[ErrorClass]
    ERROR_CLASS_FUNCTION: _ClassVar[ErrorClass]
    ERROR_CLASS_TRANSIENT: _ClassVar[ErrorClass]

class RefusalReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_REASON_UNSPECIFIED: _ClassVar[RefusalReason]
    REFUSAL_REASON_DRAINING: _ClassVar[RefusalReason]
    REFUSAL_REASON_RESOURCE_EXHAUSTED: _ClassVar[RefusalReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
ERROR_CLASS_UNSPECIFIED: ErrorClass
ERROR_CLASS_INVALID: ErrorClass
ERROR_CLASS_FUNCTION: ErrorClass
ERROR_CLASS_TRANSIENT: ErrorClass
REFUSAL_REASON_UNSPECIFIED: RefusalReason
REFUSAL_REASON_DRAINING: RefusalReason
REFUSAL_REASON_RESOURCE_EXHAUSTED: RefusalReason

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_new_tokens", "stop", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("sample_id", "prompt_id", "index", "prompt_token_ids", "token_ids", "logprobs", "policy_version", "finish_reason", "text", "last_policy_version", "cached_prompt_tokens")
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LAST_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    sample_id: str
    prompt_id: str
    index: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    policy_version: int
    finish_reason: FinishReason
    text: str
    last_policy_version: int
    cached_prompt_tokens: int
    def __init__(self, sample_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., index: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., policy_version: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., text: _Optional[str] = ..., last_policy_version: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class RewardSample(_message.Message):
    __slots__ = ("sample_id", "prompt_id", "prompt", "completion", "fields", "token_ids", "policy_version", "messages", "values")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _struct_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    sample_id: str
    prompt_id: str
    prompt: str
    completion: str
    fields: _containers.ScalarMap[str, str]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    policy_version: int
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    values: _containers.MessageMap[str, _struct_pb2.Value]
    def __init__(self, sample_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., prompt: _Optional[str] = ..., completion: _Optional[str] = ..., fields: _Optional[_Mapping[str, str]] = ..., token_ids: _Optional[_Iterable[int]] = ..., policy_version: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., values: _Optional[_Mapping[str, _struct_pb2.Value]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ScoreError(_message.Message):
    __slots__ = ("error_class", "message", "function", "refusal")
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    error_class: ErrorClass
    message: str
    function: str
    refusal: RefusalReason
    def __init__(self, error_class: _Optional[_Union[ErrorClass, str]] = ..., message: _Optional[str] = ..., function: _Optional[str] = ..., refusal: _Optional[_Union[RefusalReason, str]] = ...) -> None: ...

class SampleScore(_message.Message):
    __slots__ = ("sample_id", "score", "components", "error", "latency_seconds")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    sample_id: str
    score: float
    components: _containers.ScalarMap[str, float]
    error: ScoreError
    latency_seconds: float
    def __init__(self, sample_id: _Optional[str] = ..., score: _Optional[float] = ..., components: _Optional[_Mapping[str, float]] = ..., error: _Optional[_Union[ScoreError, _Mapping]] = ..., latency_seconds: _Optional[float] = ...) -> None: ...
