// Lowering of validated expression trees (expression masks and score
// modifications) to CUDA device code. Everything emitted is produced here:
// identifiers are ours, constants are printed by us (ints in decimal, floats
// as hex-float literals), and buffer names become slot numbers; no client
// string ever reaches the source. Thread-safe (pure functions).
//
// Semantics of the generated code:
//  - int is int32 with wrapping (two's complement) ADD, SUB, MUL, NEG and
//    ABS (computed through unsigned, so no undefined behaviour; ABS(INT_MIN)
//    is INT_MIN). There is no int division. MOD gives the mathematical
//    modulus in [0, |rhs|) and 0 when rhs is 0.
//  - float is fp32: +, -, *, / as IEEE operations under the daemon's NVRTC
//    options; MIN/MAX are fminf/fmaxf; EXP/TANH are expf/tanhf.
//  - comparisons of floats follow IEEE (false with a NaN, except NE).
//  - a buffer read outside [0, extent) in any dimension, from a null
//    buffer, or from a buffer whose launch rank differs from the spec reads
//    0 / 0.0f / false; bool buffers hold one byte per element (nonzero =
//    true).
//  - SELECT evaluates both branches (they have no side effects).
//
// With the backward pass (spec.backward), a score modification also gets
// kc_expr_score_grad (docs/kernel-contract.md, "Backward"): the forward
// body verbatim, then a reverse-mode sweep over the same temporaries.
// Derivatives: + - * / and NEG as usual; ABS: sign (0 at 0); EXP: its value;
// TANH: 1 - tanh^2; MIN/MAX: everything to the operand returned (the left
// one on ties, the non-NaN one when one is NaN); SELECT: to the branch
// taken; ints, bools, TO_FLOAT, comparisons, constants, select conditions
// and buffer indices carry none. Reads of float32 buffers declared
// trainable add grad * adjoint into p.buffer_grads[slot] at the element
// read, with atomicAdd, only when the read is in range (the conditions of
// the read helper), p.buffer_grads[slot] is non-null, the adjoint is
// nonzero and the caller passes buffer_grads = true.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kcache/v1/spec.pb.h"

namespace kcache::attention {

// Device code for a normalized, validated spec: the bounds-checked read
// helper of every declared buffer (and the gradient helper kc_grad_<slot>
// of each trainable one, with backward), the int modulus helper when used,
// and kc_expr_mask / kc_expr_score (docs/kernel-contract.md) for an
// expression mask / score modification, plus kc_expr_score_grad for a
// score modification with backward. Empty when the spec has neither. Must follow
// #include "attention_params.h" in the translation unit. InvalidArgument if
// a tree does not type-check (callers validate first; this is a backstop).
absl::StatusOr<std::string> LowerSpecExpressions(const v1::AttentionSpec& normalized);

// A float as a CUDA hex-float literal, e.g. 3.0f -> "0x1.8p+1f",
// -0.5f -> "-0x1p-1f". Precondition: finite.
std::string HexFloatLiteral(float v);

// An int32 as a CUDA literal of type int ("-7", "(-2147483647 - 1)").
std::string IntLiteral(int v);

}  // namespace kcache::attention
