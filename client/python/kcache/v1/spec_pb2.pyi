from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

CAUSAL_ALIGNMENT_BOTTOM_RIGHT: CausalAlignment
CAUSAL_ALIGNMENT_TOP_LEFT: CausalAlignment
CAUSAL_ALIGNMENT_UNSPECIFIED: CausalAlignment
DESCRIPTOR: _descriptor.FileDescriptor
DTYPE_BF16: DType
DTYPE_FP16: DType
DTYPE_UNSPECIFIED: DType
ELEM_TYPE_BOOL: ElemType
ELEM_TYPE_FLOAT32: ElemType
ELEM_TYPE_INT32: ElemType
ELEM_TYPE_UNSPECIFIED: ElemType
INDEX_VAR_B: IndexVar
INDEX_VAR_H: IndexVar
INDEX_VAR_KV_IDX: IndexVar
INDEX_VAR_Q_IDX: IndexVar
INDEX_VAR_UNSPECIFIED: IndexVar

class AlibiScoreMod(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class AttentionSpec(_message.Message):
    __slots__ = ["backward", "buffers", "deterministic", "dtype", "head_dim_qk", "head_dim_v", "mask", "num_kv_heads", "num_q_heads", "return_lse", "score_mod", "softmax_scale", "tuning"]
    BACKWARD_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_QK_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_V_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_Q_HEADS_FIELD_NUMBER: _ClassVar[int]
    RETURN_LSE_FIELD_NUMBER: _ClassVar[int]
    SCORE_MOD_FIELD_NUMBER: _ClassVar[int]
    SOFTMAX_SCALE_FIELD_NUMBER: _ClassVar[int]
    TUNING_FIELD_NUMBER: _ClassVar[int]
    backward: bool
    buffers: _containers.RepeatedCompositeFieldContainer[BufferDecl]
    deterministic: bool
    dtype: DType
    head_dim_qk: int
    head_dim_v: int
    mask: MaskSpec
    num_kv_heads: int
    num_q_heads: int
    return_lse: bool
    score_mod: ScoreMod
    softmax_scale: float
    tuning: Tuning
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., head_dim_qk: _Optional[int] = ..., head_dim_v: _Optional[int] = ..., num_q_heads: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., softmax_scale: _Optional[float] = ..., mask: _Optional[_Union[MaskSpec, _Mapping]] = ..., score_mod: _Optional[_Union[ScoreMod, _Mapping]] = ..., buffers: _Optional[_Iterable[_Union[BufferDecl, _Mapping]]] = ..., backward: bool = ..., return_lse: bool = ..., deterministic: bool = ..., tuning: _Optional[_Union[Tuning, _Mapping]] = ...) -> None: ...

class BinaryExpr(_message.Message):
    __slots__ = ["lhs", "op", "rhs"]
    class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    LHS_FIELD_NUMBER: _ClassVar[int]
    OP_ADD: BinaryExpr.Op
    OP_AND: BinaryExpr.Op
    OP_DIV: BinaryExpr.Op
    OP_EQ: BinaryExpr.Op
    OP_FIELD_NUMBER: _ClassVar[int]
    OP_FLOORDIV: BinaryExpr.Op
    OP_GE: BinaryExpr.Op
    OP_GT: BinaryExpr.Op
    OP_LE: BinaryExpr.Op
    OP_LT: BinaryExpr.Op
    OP_MAX: BinaryExpr.Op
    OP_MIN: BinaryExpr.Op
    OP_MOD: BinaryExpr.Op
    OP_MUL: BinaryExpr.Op
    OP_NE: BinaryExpr.Op
    OP_OR: BinaryExpr.Op
    OP_SUB: BinaryExpr.Op
    OP_UNSPECIFIED: BinaryExpr.Op
    RHS_FIELD_NUMBER: _ClassVar[int]
    lhs: Expr
    op: BinaryExpr.Op
    rhs: Expr
    def __init__(self, op: _Optional[_Union[BinaryExpr.Op, str]] = ..., lhs: _Optional[_Union[Expr, _Mapping]] = ..., rhs: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class BufferDecl(_message.Message):
    __slots__ = ["name", "rank", "trainable", "type"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    rank: int
    trainable: bool
    type: ElemType
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[ElemType, str]] = ..., rank: _Optional[int] = ..., trainable: bool = ...) -> None: ...

class BufferRead(_message.Message):
    __slots__ = ["buffer", "index"]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    index: _containers.RepeatedCompositeFieldContainer[Expr]
    def __init__(self, buffer: _Optional[str] = ..., index: _Optional[_Iterable[_Union[Expr, _Mapping]]] = ...) -> None: ...

class CausalMask(_message.Message):
    __slots__ = ["alignment"]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    alignment: CausalAlignment
    def __init__(self, alignment: _Optional[_Union[CausalAlignment, str]] = ...) -> None: ...

class DocumentMask(_message.Message):
    __slots__ = ["causal"]
    CAUSAL_FIELD_NUMBER: _ClassVar[int]
    causal: bool
    def __init__(self, causal: bool = ...) -> None: ...

class DrafterMask(_message.Message):
    __slots__ = ["block_size", "causal_within_block", "context_window"]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CAUSAL_WITHIN_BLOCK_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    causal_within_block: bool
    context_window: int
    def __init__(self, block_size: _Optional[int] = ..., causal_within_block: bool = ..., context_window: _Optional[int] = ...) -> None: ...

class Expr(_message.Message):
    __slots__ = ["binary", "bool_const", "float_const", "index", "int_const", "read", "score", "select", "unary"]
    BINARY_FIELD_NUMBER: _ClassVar[int]
    BOOL_CONST_FIELD_NUMBER: _ClassVar[int]
    FLOAT_CONST_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    INT_CONST_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SELECT_FIELD_NUMBER: _ClassVar[int]
    UNARY_FIELD_NUMBER: _ClassVar[int]
    binary: BinaryExpr
    bool_const: bool
    float_const: float
    index: IndexVar
    int_const: int
    read: BufferRead
    score: bool
    select: SelectExpr
    unary: UnaryExpr
    def __init__(self, index: _Optional[_Union[IndexVar, str]] = ..., int_const: _Optional[int] = ..., float_const: _Optional[float] = ..., bool_const: bool = ..., unary: _Optional[_Union[UnaryExpr, _Mapping]] = ..., binary: _Optional[_Union[BinaryExpr, _Mapping]] = ..., select: _Optional[_Union[SelectExpr, _Mapping]] = ..., read: _Optional[_Union[BufferRead, _Mapping]] = ..., score: bool = ...) -> None: ...

class ExprMask(_message.Message):
    __slots__ = ["predicate"]
    PREDICATE_FIELD_NUMBER: _ClassVar[int]
    predicate: Expr
    def __init__(self, predicate: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class ExprScoreMod(_message.Message):
    __slots__ = ["value"]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: Expr
    def __init__(self, value: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class MaskSpec(_message.Message):
    __slots__ = ["causal", "document", "drafter", "expr", "none", "sliding_window"]
    CAUSAL_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    EXPR_FIELD_NUMBER: _ClassVar[int]
    NONE_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    causal: CausalMask
    document: DocumentMask
    drafter: DrafterMask
    expr: ExprMask
    none: NoMask
    sliding_window: SlidingWindowMask
    def __init__(self, none: _Optional[_Union[NoMask, _Mapping]] = ..., causal: _Optional[_Union[CausalMask, _Mapping]] = ..., sliding_window: _Optional[_Union[SlidingWindowMask, _Mapping]] = ..., document: _Optional[_Union[DocumentMask, _Mapping]] = ..., drafter: _Optional[_Union[DrafterMask, _Mapping]] = ..., expr: _Optional[_Union[ExprMask, _Mapping]] = ...) -> None: ...

class NoMask(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class NoScoreMod(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class RawKernel(_message.Message):
    __slots__ = ["format", "kernel_names", "source"]
    class Format(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_LLVM_BITCODE: RawKernel.Format
    FORMAT_LLVM_IR: RawKernel.Format
    FORMAT_PTX: RawKernel.Format
    FORMAT_UNSPECIFIED: RawKernel.Format
    KERNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    format: RawKernel.Format
    kernel_names: _containers.RepeatedScalarFieldContainer[str]
    source: bytes
    def __init__(self, format: _Optional[_Union[RawKernel.Format, str]] = ..., source: _Optional[bytes] = ..., kernel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class ScoreMod(_message.Message):
    __slots__ = ["alibi", "expr", "none", "softcap"]
    ALIBI_FIELD_NUMBER: _ClassVar[int]
    EXPR_FIELD_NUMBER: _ClassVar[int]
    NONE_FIELD_NUMBER: _ClassVar[int]
    SOFTCAP_FIELD_NUMBER: _ClassVar[int]
    alibi: AlibiScoreMod
    expr: ExprScoreMod
    none: NoScoreMod
    softcap: SoftCapScoreMod
    def __init__(self, none: _Optional[_Union[NoScoreMod, _Mapping]] = ..., softcap: _Optional[_Union[SoftCapScoreMod, _Mapping]] = ..., alibi: _Optional[_Union[AlibiScoreMod, _Mapping]] = ..., expr: _Optional[_Union[ExprScoreMod, _Mapping]] = ...) -> None: ...

class SelectExpr(_message.Message):
    __slots__ = ["cond", "if_false", "if_true"]
    COND_FIELD_NUMBER: _ClassVar[int]
    IF_FALSE_FIELD_NUMBER: _ClassVar[int]
    IF_TRUE_FIELD_NUMBER: _ClassVar[int]
    cond: Expr
    if_false: Expr
    if_true: Expr
    def __init__(self, cond: _Optional[_Union[Expr, _Mapping]] = ..., if_true: _Optional[_Union[Expr, _Mapping]] = ..., if_false: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class SlidingWindowMask(_message.Message):
    __slots__ = ["alignment", "left", "right"]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    RIGHT_FIELD_NUMBER: _ClassVar[int]
    alignment: CausalAlignment
    left: int
    right: int
    def __init__(self, left: _Optional[int] = ..., right: _Optional[int] = ..., alignment: _Optional[_Union[CausalAlignment, str]] = ...) -> None: ...

class SoftCapScoreMod(_message.Message):
    __slots__ = ["cap"]
    CAP_FIELD_NUMBER: _ClassVar[int]
    cap: float
    def __init__(self, cap: _Optional[float] = ...) -> None: ...

class Target(_message.Message):
    __slots__ = ["arch", "device", "driver_version"]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    arch: str
    device: int
    driver_version: int
    def __init__(self, arch: _Optional[str] = ..., device: _Optional[int] = ..., driver_version: _Optional[int] = ...) -> None: ...

class Tuning(_message.Message):
    __slots__ = ["block_m", "block_n", "num_warps", "stages"]
    BLOCK_M_FIELD_NUMBER: _ClassVar[int]
    BLOCK_N_FIELD_NUMBER: _ClassVar[int]
    NUM_WARPS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    block_m: int
    block_n: int
    num_warps: int
    stages: int
    def __init__(self, block_m: _Optional[int] = ..., block_n: _Optional[int] = ..., num_warps: _Optional[int] = ..., stages: _Optional[int] = ...) -> None: ...

class UnaryExpr(_message.Message):
    __slots__ = ["arg", "op"]
    class Op(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    ARG_FIELD_NUMBER: _ClassVar[int]
    OP_ABS: UnaryExpr.Op
    OP_EXP: UnaryExpr.Op
    OP_FIELD_NUMBER: _ClassVar[int]
    OP_NEG: UnaryExpr.Op
    OP_NOT: UnaryExpr.Op
    OP_TANH: UnaryExpr.Op
    OP_TO_FLOAT: UnaryExpr.Op
    OP_UNSPECIFIED: UnaryExpr.Op
    arg: Expr
    op: UnaryExpr.Op
    def __init__(self, op: _Optional[_Union[UnaryExpr.Op, str]] = ..., arg: _Optional[_Union[Expr, _Mapping]] = ...) -> None: ...

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class IndexVar(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ElemType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class CausalAlignment(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
