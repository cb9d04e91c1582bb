from kcache.v1 import record_pb2 as _record_pb2
from kcache.v1 import spec_pb2 as _spec_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BundleChunk(_message.Message):
    __slots__ = ["data"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class EntrySummary(_message.Message):
    __slots__ = ["access", "pinned", "record"]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    access: _record_pb2.AccessStats
    pinned: bool
    record: _record_pb2.KernelRecord
    def __init__(self, record: _Optional[_Union[_record_pb2.KernelRecord, _Mapping]] = ..., access: _Optional[_Union[_record_pb2.AccessStats, _Mapping]] = ..., pinned: bool = ...) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ["grace_period_ms", "max_bytes"]
    GRACE_PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    grace_period_ms: int
    max_bytes: int
    def __init__(self, max_bytes: _Optional[int] = ..., grace_period_ms: _Optional[int] = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ["evicted_entries", "freed_bytes", "unreadable"]
    EVICTED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    evicted_entries: int
    freed_bytes: int
    unreadable: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, evicted_entries: _Optional[int] = ..., freed_bytes: _Optional[int] = ..., unreadable: _Optional[_Iterable[str]] = ...) -> None: ...

class ExportRequest(_message.Message):
    __slots__ = ["filter"]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: Filter
    def __init__(self, filter: _Optional[_Union[Filter, _Mapping]] = ...) -> None: ...

class Filter(_message.Message):
    __slots__ = ["arch", "created_before_unix_ms", "key_prefix", "mask_kind", "pinned", "toolchain_id", "unused_since_unix_ms"]
    class Pinned(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    ARCH_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    MASK_KIND_FIELD_NUMBER: _ClassVar[int]
    PINNED_ANY: Filter.Pinned
    PINNED_FIELD_NUMBER: _ClassVar[int]
    PINNED_NONE: Filter.Pinned
    PINNED_ONLY: Filter.Pinned
    TOOLCHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    UNUSED_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    arch: str
    created_before_unix_ms: int
    key_prefix: bytes
    mask_kind: str
    pinned: Filter.Pinned
    toolchain_id: str
    unused_since_unix_ms: int
    def __init__(self, toolchain_id: _Optional[str] = ..., arch: _Optional[str] = ..., mask_kind: _Optional[str] = ..., created_before_unix_ms: _Optional[int] = ..., unused_since_unix_ms: _Optional[int] = ..., pinned: _Optional[_Union[Filter.Pinned, str]] = ..., key_prefix: _Optional[bytes] = ...) -> None: ...

class GetKernelEvent(_message.Message):
    __slots__ = ["progress", "result"]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    progress: Progress
    result: GetKernelResponse
    def __init__(self, progress: _Optional[_Union[Progress, _Mapping]] = ..., result: _Optional[_Union[GetKernelResponse, _Mapping]] = ...) -> None: ...

class GetKernelRequest(_message.Message):
    __slots__ = ["raw", "spec", "target"]
    RAW_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    raw: _spec_pb2.RawKernel
    spec: _spec_pb2.AttentionSpec
    target: _spec_pb2.Target
    def __init__(self, spec: _Optional[_Union[_spec_pb2.AttentionSpec, _Mapping]] = ..., target: _Optional[_Union[_spec_pb2.Target, _Mapping]] = ..., raw: _Optional[_Union[_spec_pb2.RawKernel, _Mapping]] = ...) -> None: ...

class GetKernelResponse(_message.Message):
    __slots__ = ["cache_hit", "cubin", "record"]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    CUBIN_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    cache_hit: bool
    cubin: bytes
    record: _record_pb2.KernelRecord
    def __init__(self, record: _Optional[_Union[_record_pb2.KernelRecord, _Mapping]] = ..., cubin: _Optional[bytes] = ..., cache_hit: bool = ...) -> None: ...

class GroupStats(_message.Message):
    __slots__ = ["arch", "bytes", "entries", "toolchain_id"]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TOOLCHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    arch: str
    bytes: int
    entries: int
    toolchain_id: str
    def __init__(self, toolchain_id: _Optional[str] = ..., arch: _Optional[str] = ..., entries: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ImportResponse(_message.Message):
    __slots__ = ["already_present", "imported"]
    ALREADY_PRESENT_FIELD_NUMBER: _ClassVar[int]
    IMPORTED_FIELD_NUMBER: _ClassVar[int]
    already_present: int
    imported: int
    def __init__(self, imported: _Optional[int] = ..., already_present: _Optional[int] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ["include_cubin", "key"]
    INCLUDE_CUBIN_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    include_cubin: bool
    key: bytes
    def __init__(self, key: _Optional[bytes] = ..., include_cubin: bool = ...) -> None: ...

class InspectResponse(_message.Message):
    __slots__ = ["cubin", "entry"]
    CUBIN_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    cubin: bytes
    entry: EntrySummary
    def __init__(self, entry: _Optional[_Union[EntrySummary, _Mapping]] = ..., cubin: _Optional[bytes] = ...) -> None: ...

class InvalidateRequest(_message.Message):
    __slots__ = ["arch", "created_before_unix_ms", "key", "toolchain_id"]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOOLCHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    arch: str
    created_before_unix_ms: int
    key: bytes
    toolchain_id: str
    def __init__(self, toolchain_id: _Optional[str] = ..., arch: _Optional[str] = ..., created_before_unix_ms: _Optional[int] = ..., key: _Optional[bytes] = ...) -> None: ...

class InvalidateResponse(_message.Message):
    __slots__ = ["freed_bytes", "removed_entries", "unreadable"]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REMOVED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    freed_bytes: int
    removed_entries: int
    unreadable: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, removed_entries: _Optional[int] = ..., freed_bytes: _Optional[int] = ..., unreadable: _Optional[_Iterable[str]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ["filter", "page_size", "page_token"]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: Filter
    page_size: int
    page_token: bytes
    def __init__(self, filter: _Optional[_Union[Filter, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[bytes] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ["entries", "next_page_token", "unreadable"]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[EntrySummary]
    next_page_token: bytes
    unreadable: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entries: _Optional[_Iterable[_Union[EntrySummary, _Mapping]]] = ..., next_page_token: _Optional[bytes] = ..., unreadable: _Optional[_Iterable[str]] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ["key", "reason"]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    reason: str
    def __init__(self, key: _Optional[bytes] = ..., reason: _Optional[str] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ["requests"]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[GetKernelRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[GetKernelRequest, _Mapping]]] = ...) -> None: ...

class PrefetchResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PrefetchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PrefetchResult, _Mapping]]] = ...) -> None: ...

class PrefetchResult(_message.Message):
    __slots__ = ["error", "key", "state"]
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    ERROR_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_CACHED: PrefetchResult.State
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_QUEUED: PrefetchResult.State
    STATE_REJECTED: PrefetchResult.State
    STATE_UNSPECIFIED: PrefetchResult.State
    error: str
    key: bytes
    state: PrefetchResult.State
    def __init__(self, state: _Optional[_Union[PrefetchResult.State, str]] = ..., key: _Optional[bytes] = ..., error: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ["phase", "queue", "queue_position"]
    class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    PHASE_COMPILING: Progress.Phase
    PHASE_DONE: Progress.Phase
    PHASE_FAILED: Progress.Phase
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PHASE_QUEUED: Progress.Phase
    PHASE_UNSPECIFIED: Progress.Phase
    PHASE_VERIFYING: Progress.Phase
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    phase: Progress.Phase
    queue: str
    queue_position: int
    def __init__(self, phase: _Optional[_Union[Progress.Phase, str]] = ..., queue_position: _Optional[int] = ..., queue: _Optional[str] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ["busy", "depth", "name"]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    busy: bool
    depth: int
    name: str
    def __init__(self, name: _Optional[str] = ..., depth: _Optional[int] = ..., busy: bool = ...) -> None: ...

class RemoteTierStats(_message.Message):
    __slots__ = ["address", "bad_entries", "bytes_read", "bytes_written", "connected", "errors", "hits", "last_error", "lease_waits", "leases", "misses", "publishes", "reconnects", "takeovers", "wait_timeouts"]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BAD_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    LEASE_WAITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHES_FIELD_NUMBER: _ClassVar[int]
    RECONNECTS_FIELD_NUMBER: _ClassVar[int]
    TAKEOVERS_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    address: str
    bad_entries: int
    bytes_read: int
    bytes_written: int
    connected: bool
    errors: int
    hits: int
    last_error: str
    lease_waits: int
    leases: int
    misses: int
    publishes: int
    reconnects: int
    takeovers: int
    wait_timeouts: int
    def __init__(self, address: _Optional[str] = ..., connected: bool = ..., last_error: _Optional[str] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., errors: _Optional[int] = ..., bad_entries: _Optional[int] = ..., publishes: _Optional[int] = ..., leases: _Optional[int] = ..., lease_waits: _Optional[int] = ..., takeovers: _Optional[int] = ..., wait_timeouts: _Optional[int] = ..., bytes_read: _Optional[int] = ..., bytes_written: _Optional[int] = ..., reconnects: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ["blob_bytes", "blobs", "compile_failures", "compile_only", "compiles", "devices", "entries", "groups", "hits", "misses", "pinned", "quarantined", "queues", "raw_toolchain", "remote", "requests", "store_damage", "toolchain", "unreadable"]
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    BLOB_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPILES_FIELD_NUMBER: _ClassVar[int]
    COMPILE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    COMPILE_ONLY_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    RAW_TOOLCHAIN_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STORE_DAMAGE_FIELD_NUMBER: _ClassVar[int]
    TOOLCHAIN_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    blob_bytes: int
    blobs: int
    compile_failures: int
    compile_only: bool
    compiles: int
    devices: _containers.RepeatedScalarFieldContainer[str]
    entries: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupStats]
    hits: int
    misses: int
    pinned: int
    quarantined: int
    queues: _containers.RepeatedCompositeFieldContainer[QueueStats]
    raw_toolchain: _record_pb2.Toolchain
    remote: RemoteTierStats
    requests: int
    store_damage: str
    toolchain: _record_pb2.Toolchain
    unreadable: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entries: _Optional[int] = ..., blob_bytes: _Optional[int] = ..., blobs: _Optional[int] = ..., pinned: _Optional[int] = ..., quarantined: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupStats, _Mapping]]] = ..., requests: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., compiles: _Optional[int] = ..., compile_failures: _Optional[int] = ..., queues: _Optional[_Iterable[_Union[QueueStats, _Mapping]]] = ..., toolchain: _Optional[_Union[_record_pb2.Toolchain, _Mapping]] = ..., devices: _Optional[_Iterable[str]] = ..., compile_only: bool = ..., raw_toolchain: _Optional[_Union[_record_pb2.Toolchain, _Mapping]] = ..., unreadable: _Optional[_Iterable[str]] = ..., store_damage: _Optional[str] = ..., remote: _Optional[_Union[RemoteTierStats, _Mapping]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ["checked", "corrupt", "quarantined_keys", "unreadable"]
    CHECKED_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_KEYS_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    checked: int
    corrupt: int
    quarantined_keys: _containers.RepeatedScalarFieldContainer[bytes]
    unreadable: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checked: _Optional[int] = ..., corrupt: _Optional[int] = ..., quarantined_keys: _Optional[_Iterable[bytes]] = ..., unreadable: _Optional[_Iterable[str]] = ...) -> None: ...
