// The canonical byte encoding of a normalized attention spec: the spec's
// part of the kernel key. Written field by field here, not by protobuf
// serialization, whose byte output is not guaranteed stable across protobuf
// versions. Thread-safe (pure function).
#pragma once

#include <cstdint>
#include <string>

#include "kcache/v1/spec.pb.h"

namespace kcache::attention {

// Bumped on any change to the encoding below (which changes every key).
constexpr uint32_t kCanonicalSpecVersion = 1;

// Precondition: `normalized` came from NormalizeAttentionSpec. Layout:
//   "kcspec" u32(version) then a message body, where a message body is a
//   sequence of fields in a fixed order, each: u16 tag, u8 kind, u32 length,
//   payload. Kinds: 'u' u32/enum, 'i' i32, 'f' f32 by IEEE bit pattern,
//   'b' bool (1 byte), 's' string (bytes), 'm' nested message body,
//   'o' oneof (u16 case tag, then the member's body), 'r' repeated
//   (u32 count, then each element as a field with tag 0).
// Every field is written, defaults included. All integers little-endian.
// Unknown fields are not encoded (validation rejects them).
std::string CanonicalSpecBytes(const v1::AttentionSpec& normalized);

}  // namespace kcache::attention
