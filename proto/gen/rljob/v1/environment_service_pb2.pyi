from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnvironmentErrorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENVIRONMENT_ERROR_KIND_UNSPECIFIED: _ClassVar[EnvironmentErrorKind]
    ENVIRONMENT_ERROR_KIND_INVALID_ACTION: _ClassVar[EnvironmentErrorKind]
    ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE: _ClassVar[EnvironmentErrorKind]
    ENVIRONMENT_ERROR_KIND_TIMEOUT: _ClassVar[EnvironmentErrorKind]
ENVIRONMENT_ERROR_KIND_UNSPECIFIED: EnvironmentErrorKind
ENVIRONMENT_ERROR_KIND_INVALID_ACTION: EnvironmentErrorKind
ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE: EnvironmentErrorKind
ENVIRONMENT_ERROR_KIND_TIMEOUT: EnvironmentErrorKind

class EpisodeRequest(_message.Message):
    __slots__ = ("start", "action")
    START_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    start: EpisodeStart
    action: Action
    def __init__(self, start: _Optional[_Union[EpisodeStart, _Mapping]] = ..., action: _Optional[_Union[Action, _Mapping]] = ...) -> None: ...

class EpisodeStart(_message.Message):
    __slots__ = ("episode_id", "task", "seed", "prompt")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    task: _struct_pb2.Struct
    seed: int
    prompt: str
    def __init__(self, episode_id: _Optional[str] = ..., task: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., seed: _Optional[int] = ..., prompt: _Optional[str] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("text", "token_ids", "turn")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    turn: int
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., turn: _Optional[int] = ...) -> None: ...

class EnvironmentMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("text", "messages")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    text: str
    messages: _containers.RepeatedCompositeFieldContainer[EnvironmentMessage]
    def __init__(self, text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[EnvironmentMessage, _Mapping]]] = ...) -> None: ...

class EnvironmentError(_message.Message):
    __slots__ = ("kind", "message")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    kind: EnvironmentErrorKind
    message: str
    def __init__(self, kind: _Optional[_Union[EnvironmentErrorKind, str]] = ..., message: _Optional[str] = ...) -> None: ...

class EpisodeResponse(_message.Message):
    __slots__ = ("observation", "reward", "done", "final_reward", "metrics", "error", "tool")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FINAL_REWARD_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    observation: Observation
    reward: float
    done: bool
    final_reward: float
    metrics: _containers.ScalarMap[str, float]
    error: EnvironmentError
    tool: str
    def __init__(self, observation: _Optional[_Union[Observation, _Mapping]] = ..., reward: _Optional[float] = ..., done: _Optional[bool] = ..., final_reward: _Optional[float] = ..., metrics: _Optional[_Mapping[str, float]] = ..., error: _Optional[_Union[EnvironmentError, _Mapping]] = ..., tool: _Optional[str] = ...) -> None: ...

class EnvironmentServiceInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class EnvironmentServiceInfoResponse(_message.Message):
    __slots__ = ("name", "version", "tools", "max_turns", "stop", "max_episodes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    max_turns: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    max_episodes: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., max_turns: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., max_episodes: _Optional[int] = ...) -> None: ...
