from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class FetchWeightsRequest(_message.Message):
    __slots__ = ("min_version", "max_chunk_bytes")
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    min_version: int
    max_chunk_bytes: int
    def __init__(self, min_version: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ...) -> None: ...

class FetchWeightsResponse(_message.Message):
    __slots__ = ("version", "name", "dtype", "shape", "offset", "data", "total_bytes", "tensor_count")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENSOR_COUNT_FIELD_NUMBER: _ClassVar[int]
    version: int
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    data: bytes
    total_bytes: int
    tensor_count: int
    def __init__(self, version: _Optional[int] = ..., name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total_bytes: _Optional[int] = ..., tensor_count: _Optional[int] = ...) -> None: ...

class GetLatestVersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLatestVersionResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...
