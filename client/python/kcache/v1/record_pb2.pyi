from kcache.v1 import spec_pb2 as _spec_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
ENTRY_ROLE_BACKWARD: EntryRole
ENTRY_ROLE_BACKWARD_DQ: EntryRole
ENTRY_ROLE_BACKWARD_MASK_BUILD: EntryRole
ENTRY_ROLE_BACKWARD_POSTPROCESS: EntryRole
ENTRY_ROLE_BACKWARD_PREPROCESS: EntryRole
ENTRY_ROLE_FORWARD: EntryRole
ENTRY_ROLE_MASK_BUILD: EntryRole
ENTRY_ROLE_UNSPECIFIED: EntryRole
NUMERIC_CHECK_PASSED: NumericCheckState
NUMERIC_CHECK_UNCHECKED: NumericCheckState
NUMERIC_CHECK_UNSPECIFIED: NumericCheckState

class AccessStats(_message.Message):
    __slots__ = ["hits", "last_used_unix_ms"]
    HITS_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    hits: int
    last_used_unix_ms: int
    def __init__(self, hits: _Optional[int] = ..., last_used_unix_ms: _Optional[int] = ...) -> None: ...

class EntryPoint(_message.Message):
    __slots__ = ["block_m", "block_n", "dynamic_smem_bytes", "name", "resources", "role", "threads"]
    BLOCK_M_FIELD_NUMBER: _ClassVar[int]
    BLOCK_N_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_SMEM_BYTES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    block_m: int
    block_n: int
    dynamic_smem_bytes: int
    name: str
    resources: Resources
    role: EntryRole
    threads: int
    def __init__(self, name: _Optional[str] = ..., role: _Optional[_Union[EntryRole, str]] = ..., threads: _Optional[int] = ..., dynamic_smem_bytes: _Optional[int] = ..., block_m: _Optional[int] = ..., block_n: _Optional[int] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ...) -> None: ...

class KernelRecord(_message.Message):
    __slots__ = ["abi_version", "arch", "compile_log", "compile_time_us", "created_unix_ms", "cubin_sha256", "cubin_size", "deterministic_backward", "entry_points", "format_version", "key", "numeric_check", "raw", "spec", "template_digest", "toolchain", "verified", "verified_on"]
    ABI_VERSION_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    COMPILE_LOG_FIELD_NUMBER: _ClassVar[int]
    COMPILE_TIME_US_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CUBIN_SHA256_FIELD_NUMBER: _ClassVar[int]
    CUBIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_BACKWARD_FIELD_NUMBER: _ClassVar[int]
    ENTRY_POINTS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NUMERIC_CHECK_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TOOLCHAIN_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_ON_FIELD_NUMBER: _ClassVar[int]
    abi_version: int
    arch: str
    compile_log: str
    compile_time_us: int
    created_unix_ms: int
    cubin_sha256: bytes
    cubin_size: int
    deterministic_backward: bool
    entry_points: _containers.RepeatedCompositeFieldContainer[EntryPoint]
    format_version: int
    key: bytes
    numeric_check: NumericCheck
    raw: RawKernelInfo
    spec: _spec_pb2.AttentionSpec
    template_digest: str
    toolchain: Toolchain
    verified: bool
    verified_on: str
    def __init__(self, format_version: _Optional[int] = ..., key: _Optional[bytes] = ..., toolchain: _Optional[_Union[Toolchain, _Mapping]] = ..., arch: _Optional[str] = ..., spec: _Optional[_Union[_spec_pb2.AttentionSpec, _Mapping]] = ..., template_digest: _Optional[str] = ..., cubin_sha256: _Optional[bytes] = ..., cubin_size: _Optional[int] = ..., entry_points: _Optional[_Iterable[_Union[EntryPoint, _Mapping]]] = ..., abi_version: _Optional[int] = ..., verified: bool = ..., verified_on: _Optional[str] = ..., compile_time_us: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., compile_log: _Optional[str] = ..., deterministic_backward: bool = ..., raw: _Optional[_Union[RawKernelInfo, _Mapping]] = ..., numeric_check: _Optional[_Union[NumericCheck, _Mapping]] = ...) -> None: ...

class NumericCheck(_message.Message):
    __slots__ = ["check_time_us", "device", "max_abs_error", "rel_l2_error", "state", "tolerance"]
    CHECK_TIME_US_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    REL_L2_ERROR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    check_time_us: int
    device: str
    max_abs_error: float
    rel_l2_error: float
    state: NumericCheckState
    tolerance: float
    def __init__(self, state: _Optional[_Union[NumericCheckState, str]] = ..., max_abs_error: _Optional[float] = ..., rel_l2_error: _Optional[float] = ..., tolerance: _Optional[float] = ..., device: _Optional[str] = ..., check_time_us: _Optional[int] = ...) -> None: ...

class PinInfo(_message.Message):
    __slots__ = ["pinned_unix_ms", "reason"]
    PINNED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    pinned_unix_ms: int
    reason: str
    def __init__(self, pinned_unix_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class QuarantineInfo(_message.Message):
    __slots__ = ["quarantined_unix_ms", "reason", "record"]
    QUARANTINED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    quarantined_unix_ms: int
    reason: str
    record: KernelRecord
    def __init__(self, record: _Optional[_Union[KernelRecord, _Mapping]] = ..., quarantined_unix_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class RawKernelInfo(_message.Message):
    __slots__ = ["format", "kernel_names", "source_sha256", "source_size"]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    KERNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SHA256_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SIZE_FIELD_NUMBER: _ClassVar[int]
    format: _spec_pb2.RawKernel.Format
    kernel_names: _containers.RepeatedScalarFieldContainer[str]
    source_sha256: bytes
    source_size: int
    def __init__(self, format: _Optional[_Union[_spec_pb2.RawKernel.Format, str]] = ..., source_sha256: _Optional[bytes] = ..., source_size: _Optional[int] = ..., kernel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ["local_bytes", "max_dynamic_smem_bytes", "max_threads_per_block", "registers", "spill_bytes", "static_smem_bytes"]
    LOCAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_DYNAMIC_SMEM_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_THREADS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    REGISTERS_FIELD_NUMBER: _ClassVar[int]
    SPILL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATIC_SMEM_BYTES_FIELD_NUMBER: _ClassVar[int]
    local_bytes: int
    max_dynamic_smem_bytes: int
    max_threads_per_block: int
    registers: int
    spill_bytes: int
    static_smem_bytes: int
    def __init__(self, registers: _Optional[int] = ..., static_smem_bytes: _Optional[int] = ..., max_dynamic_smem_bytes: _Optional[int] = ..., local_bytes: _Optional[int] = ..., max_threads_per_block: _Optional[int] = ..., spill_bytes: _Optional[int] = ...) -> None: ...

class Toolchain(_message.Message):
    __slots__ = ["build", "compiler", "id", "options", "version"]
    BUILD_FIELD_NUMBER: _ClassVar[int]
    COMPILER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    build: str
    compiler: str
    id: str
    options: _containers.RepeatedScalarFieldContainer[str]
    version: str
    def __init__(self, compiler: _Optional[str] = ..., version: _Optional[str] = ..., build: _Optional[str] = ..., options: _Optional[_Iterable[str]] = ..., id: _Optional[str] = ...) -> None: ...

class EntryRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class NumericCheckState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
