// Budget checks over the wire format (no allocation), then the parse.
#include "service/request_parse.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/wire_format_lite.h"

namespace kcache {

namespace {

namespace pb = google::protobuf;
using pb::internal::WireFormatLite;

// Protobuf's own parser refuses messages nested deeper than this.
constexpr int kMaxNesting = 100;

enum class Scan { kOk, kOverBudget, kMalformed };

// Counts into *fields the fields of the message of type `d` (null: unknown,
// counted but not entered) that lies between the stream's position and its
// current limit, stopping once *fields passes `budget`.
Scan CountFields(pb::io::CodedInputStream& in, const pb::Descriptor* d, int depth, uint64_t* fields,
                 uint64_t budget) {
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      // The end of this message, or a tag the parser will refuse.
      return in.BytesUntilLimit() == 0 ? Scan::kOk : Scan::kMalformed;
    }
    if (++*fields > budget) return Scan::kOverBudget;
    const pb::FieldDescriptor* f =
        d == nullptr ? nullptr : d->FindFieldByNumber(WireFormatLite::GetTagFieldNumber(tag));
    switch (WireFormatLite::GetTagWireType(tag)) {
      case WireFormatLite::WIRETYPE_VARINT: {
        uint64_t v;
        if (!in.ReadVarint64(&v)) return Scan::kMalformed;
        break;
      }
      case WireFormatLite::WIRETYPE_FIXED32:
        if (!in.Skip(4)) return Scan::kMalformed;
        break;
      case WireFormatLite::WIRETYPE_FIXED64:
        if (!in.Skip(8)) return Scan::kMalformed;
        break;
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
        uint32_t len;
        if (!in.ReadVarint32(&len) || static_cast<int64_t>(len) > in.BytesUntilLimit()) {
          return Scan::kMalformed;
        }
        if (f != nullptr && f->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
          if (depth >= kMaxNesting) return Scan::kMalformed;
          const pb::io::CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(len));
          const Scan s = CountFields(in, f->message_type(), depth + 1, fields, budget);
          if (s != Scan::kOk) return s;
          in.PopLimit(limit);
        } else {
          if (f != nullptr && f->is_packable()) {
            // Packed scalars: at least one byte each.
            *fields += len;
            if (*fields > budget) return Scan::kOverBudget;
          }
          if (!in.Skip(static_cast<int>(len))) return Scan::kMalformed;
        }
        break;
      }
      default:
        // Groups: no kcache message has one, and an unknown one would be
        // refused after the parse anyway.
        return Scan::kMalformed;
    }
  }
}

// A CodedInputStream over `bytes`, limited to them (so that BytesUntilLimit
// tells the end of the top-level message).
struct Reader {
  explicit Reader(absl::string_view bytes)
      : in(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size())) {
    in.PushLimit(static_cast<int>(bytes.size()));
  }
  pb::io::CodedInputStream in;
};

absl::Status Unknown(const std::string& where, const pb::UnknownFieldSet& unknown) {
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": unknown field number ", unknown.field(0).number(),
                   " (a newer client? this daemon does not know it)"));
}

absl::Status NotValid(const pb::Descriptor* d) {
  return absl::InvalidArgumentError(
      absl::StrCat("request: not a valid ", d->full_name(),
                   " (malformed protobuf, or a string field that is not UTF-8)"));
}

}  // namespace

absl::Status CheckGetKernelRequestBudget(absl::string_view bytes, const RequestLimits& limits) {
  if (bytes.size() > limits.max_request_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request: ", bytes.size(), " bytes, over this daemon's limit of ",
                     limits.max_request_bytes, " bytes per GetKernelRequest"));
  }
  Reader r(bytes);
  uint64_t fields = 0;
  if (CountFields(r.in, v1::GetKernelRequest::descriptor(), 0, &fields,
                  limits.max_request_fields) == Scan::kOverBudget) {
    return absl::InvalidArgumentError(absl::StrCat("request: more than ", limits.max_request_fields,
                                                   " fields, over this daemon's limit per "
                                                   "GetKernelRequest"));
  }
  return absl::OkStatus();
}

absl::Status CheckPrefetchRequestBudget(absl::string_view bytes, const RequestLimits& limits) {
  Reader r(bytes);
  pb::io::CodedInputStream& in = r.in;
  uint64_t entries = 0;
  uint64_t total = 0;
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return absl::OkStatus();  // the end, or malformed: the parser says which
    if (WireFormatLite::GetTagFieldNumber(tag) != v1::PrefetchRequest::kRequestsFieldNumber ||
        WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      // An unknown field (refused after the parse) or malformed: count it,
      // skip it, and let the parser judge.
      ++total;
      if (!WireFormatLite::SkipField(&in, tag)) return absl::OkStatus();
      continue;
    }
    const uint64_t i = entries++;
    if (entries > limits.max_prefetch_requests) {
      return absl::InvalidArgumentError(
          absl::StrCat("requests: more than ", limits.max_prefetch_requests,
                       " entries (max_prefetch_requests); split the prefetch"));
    }
    uint32_t len;
    if (!in.ReadVarint32(&len) || static_cast<int64_t>(len) > in.BytesUntilLimit()) {
      return absl::OkStatus();  // malformed
    }
    if (len > limits.max_request_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("requests[", i, "]: ", len, " bytes, over this daemon's limit of ",
                       limits.max_request_bytes, " bytes per GetKernelRequest"));
    }
    const pb::io::CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(len));
    uint64_t fields = 0;
    const Scan s =
        CountFields(in, v1::GetKernelRequest::descriptor(), 1, &fields, limits.max_request_fields);
    if (s == Scan::kOverBudget) {
      return absl::InvalidArgumentError(absl::StrCat("requests[", i, "]: more than ",
                                                     limits.max_request_fields,
                                                     " fields, over this daemon's limit per "
                                                     "GetKernelRequest"));
    }
    if (s == Scan::kMalformed) return absl::OkStatus();
    in.PopLimit(limit);
    total += fields + 1;
    if (total > limits.max_prefetch_fields) {
      return absl::InvalidArgumentError(absl::StrCat(
          "requests: more than ", limits.max_prefetch_fields,
          " fields in all, over this daemon's limit per PrefetchRequest; split the prefetch"));
    }
  }
}

absl::Status CheckNoUnknownRequestFields(const v1::GetKernelRequest& request,
                                         const std::string& path) {
  const pb::Reflection* r = request.GetReflection();
  if (!r->GetUnknownFields(request).empty()) {
    return Unknown(path.empty() ? "request" : path.substr(0, path.size() - 1),
                   r->GetUnknownFields(request));
  }
  if (request.has_target()) {
    const pb::UnknownFieldSet& u =
        request.target().GetReflection()->GetUnknownFields(request.target());
    if (!u.empty()) return Unknown(absl::StrCat(path, "target"), u);
  }
  if (request.has_raw()) {
    const pb::UnknownFieldSet& u = request.raw().GetReflection()->GetUnknownFields(request.raw());
    if (!u.empty()) return Unknown(absl::StrCat(path, "raw"), u);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::GetKernelRequest> ParseGetKernelRequest(absl::string_view bytes,
                                                           const RequestLimits& limits) {
  if (absl::Status s = CheckGetKernelRequestBudget(bytes, limits); !s.ok()) return s;
  v1::GetKernelRequest req;
  if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return NotValid(v1::GetKernelRequest::descriptor());
  }
  if (absl::Status s = CheckNoUnknownRequestFields(req, ""); !s.ok()) return s;
  return req;
}

absl::StatusOr<v1::PrefetchRequest> ParsePrefetchRequest(absl::string_view bytes,
                                                         const RequestLimits& limits) {
  if (absl::Status s = CheckPrefetchRequestBudget(bytes, limits); !s.ok()) return s;
  v1::PrefetchRequest req;
  if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return NotValid(v1::PrefetchRequest::descriptor());
  }
  if (!req.GetReflection()->GetUnknownFields(req).empty()) {
    return Unknown("request", req.GetReflection()->GetUnknownFields(req));
  }
  for (int i = 0; i < req.requests_size(); ++i) {
    if (absl::Status s =
            CheckNoUnknownRequestFields(req.requests(i), absl::StrCat("requests[", i, "]."));
        !s.ok()) {
      return s;
    }
  }
  return req;
}

}  // namespace kcache
