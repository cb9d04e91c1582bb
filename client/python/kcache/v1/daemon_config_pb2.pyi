from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class DaemonConfig(_message.Message):
    __slots__ = ["admin_token_path", "compile_only", "compile_threads", "compile_workers", "default_deadline_ms", "enable_raw_kernels", "error_memo_ms", "eviction_grace_ms", "eviction_interval_ms", "max_expr_depth", "max_expr_nodes", "max_message_bytes", "max_prefetch_requests", "max_queue_depth", "max_raw_kernel_names", "max_raw_source_bytes", "max_store_bytes", "memory_cache_bytes", "metrics_address", "nvjitlink_path", "nvrtc_path", "remote", "remote_lease_ms", "remote_password_file", "remote_timeout_ms", "shutdown_grace_ms", "socket_path", "stats_flush_ms", "store_path", "tcp_address", "tls_cert_path", "tls_key_path", "toolchain_salt", "worker_path"]
    ADMIN_TOKEN_PATH_FIELD_NUMBER: _ClassVar[int]
    COMPILE_ONLY_FIELD_NUMBER: _ClassVar[int]
    COMPILE_THREADS_FIELD_NUMBER: _ClassVar[int]
    COMPILE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    ENABLE_RAW_KERNELS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MEMO_MS_FIELD_NUMBER: _ClassVar[int]
    EVICTION_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    EVICTION_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_EXPR_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_EXPR_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PREFETCH_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_RAW_KERNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    MAX_RAW_SOURCE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STORE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NVJITLINK_PATH_FIELD_NUMBER: _ClassVar[int]
    NVRTC_PATH_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    REMOTE_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_PASSWORD_FILE_FIELD_NUMBER: _ClassVar[int]
    REMOTE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    SOCKET_PATH_FIELD_NUMBER: _ClassVar[int]
    STATS_FLUSH_MS_FIELD_NUMBER: _ClassVar[int]
    STORE_PATH_FIELD_NUMBER: _ClassVar[int]
    TCP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TLS_CERT_PATH_FIELD_NUMBER: _ClassVar[int]
    TLS_KEY_PATH_FIELD_NUMBER: _ClassVar[int]
    TOOLCHAIN_SALT_FIELD_NUMBER: _ClassVar[int]
    WORKER_PATH_FIELD_NUMBER: _ClassVar[int]
    admin_token_path: str
    compile_only: bool
    compile_threads: int
    compile_workers: int
    default_deadline_ms: int
    enable_raw_kernels: bool
    error_memo_ms: int
    eviction_grace_ms: int
    eviction_interval_ms: int
    max_expr_depth: int
    max_expr_nodes: int
    max_message_bytes: int
    max_prefetch_requests: int
    max_queue_depth: int
    max_raw_kernel_names: int
    max_raw_source_bytes: int
    max_store_bytes: int
    memory_cache_bytes: int
    metrics_address: str
    nvjitlink_path: str
    nvrtc_path: str
    remote: str
    remote_lease_ms: int
    remote_password_file: str
    remote_timeout_ms: int
    shutdown_grace_ms: int
    socket_path: str
    stats_flush_ms: int
    store_path: str
    tcp_address: str
    tls_cert_path: str
    tls_key_path: str
    toolchain_salt: str
    worker_path: str
    def __init__(self, store_path: _Optional[str] = ..., memory_cache_bytes: _Optional[int] = ..., max_store_bytes: _Optional[int] = ..., eviction_grace_ms: _Optional[int] = ..., stats_flush_ms: _Optional[int] = ..., socket_path: _Optional[str] = ..., tcp_address: _Optional[str] = ..., tls_cert_path: _Optional[str] = ..., tls_key_path: _Optional[str] = ..., admin_token_path: _Optional[str] = ..., metrics_address: _Optional[str] = ..., nvrtc_path: _Optional[str] = ..., compile_threads: _Optional[int] = ..., compile_workers: _Optional[int] = ..., compile_only: bool = ..., max_queue_depth: _Optional[int] = ..., error_memo_ms: _Optional[int] = ..., default_deadline_ms: _Optional[int] = ..., worker_path: _Optional[str] = ..., toolchain_salt: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., max_expr_nodes: _Optional[int] = ..., max_expr_depth: _Optional[int] = ..., shutdown_grace_ms: _Optional[int] = ..., eviction_interval_ms: _Optional[int] = ..., enable_raw_kernels: bool = ..., max_raw_source_bytes: _Optional[int] = ..., max_raw_kernel_names: _Optional[int] = ..., nvjitlink_path: _Optional[str] = ..., max_prefetch_requests: _Optional[int] = ..., remote: _Optional[str] = ..., remote_password_file: _Optional[str] = ..., remote_timeout_ms: _Optional[int] = ..., remote_lease_ms: _Optional[int] = ...) -> None: ...
