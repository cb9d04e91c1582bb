// Bundle encoding and decoding (see bundle.h).
#include "cache/bundle.h"

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cache/record_codec.h"

namespace kcache {
namespace {

template <typename T>
void PutLe(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

template <typename T>
T GetLe(std::string_view in) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<T>(static_cast<uint8_t>(in[i])) << (8 * i);
  }
  return v;
}

}  // namespace

BundleWriter::BundleWriter(std::function<absl::Status(std::string_view)> sink)
    : sink_(std::move(sink)) {}

absl::Status BundleWriter::Emit(std::string_view bytes) {
  hasher_.Update(bytes);
  return sink_(bytes);
}

absl::Status BundleWriter::Begin() {
  std::string h(kBundleMagic);
  PutLe<uint32_t>(h, kBundleVersion);
  PutLe<uint32_t>(h, 0);
  return Emit(h);
}

absl::Status BundleWriter::Add(const v1::KernelRecord& record, std::string_view cubin) {
  std::string rec = record.SerializeAsString();
  if (rec.size() > kBundleMaxRecordBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("record of ", rec.size(), " bytes is too large"));
  }
  std::string head(1, 'R');
  PutLe<uint32_t>(head, static_cast<uint32_t>(rec.size()));
  head += rec;
  PutLe<uint64_t>(head, cubin.size());
  if (auto s = Emit(head); !s.ok()) return s;
  if (auto s = Emit(cubin); !s.ok()) return s;
  ++count_;
  return absl::OkStatus();
}

absl::Status BundleWriter::Finish() {
  std::string t(1, 'E');
  PutLe<uint64_t>(t, count_);
  if (auto s = Emit(t); !s.ok()) return s;
  Sha256Digest d = hasher_.Finish();
  return sink_(AsBytes(d));
}

absl::StatusOr<std::vector<BundleEntry>> DecodeBundle(std::string_view in) {
  const std::string_view all = in;
  constexpr size_t kHeader = 8 + 4 + 4;
  if (in.size() < kBundleMagic.size() || in.substr(0, kBundleMagic.size()) != kBundleMagic) {
    return absl::InvalidArgumentError("bundle: not a kcache bundle (bad magic)");
  }
  if (in.size() < kHeader) return absl::DataLossError("bundle: truncated header");
  uint32_t version = GetLe<uint32_t>(in.substr(8));
  if (version != kBundleVersion) {
    return absl::InvalidArgumentError(absl::StrCat("bundle: format version ", version,
                                                   " is not supported (this build reads ",
                                                   kBundleVersion, ")"));
  }
  if (GetLe<uint32_t>(in.substr(12)) != 0) {
    return absl::InvalidArgumentError("bundle: unknown flags set in header");
  }
  in.remove_prefix(kHeader);
  std::vector<BundleEntry> out;
  for (;;) {
    const size_t frame = out.size();
    if (in.empty()) return absl::DataLossError("bundle: truncated (no trailer)");
    const char tag = in[0];
    in.remove_prefix(1);
    if (tag == 'E') break;
    if (tag != 'R') {
      return absl::DataLossError(absl::StrCat("bundle: frame ", frame, ": bad tag"));
    }
    if (in.size() < 4)
      return absl::DataLossError(absl::StrCat("bundle: frame ", frame, ": truncated"));
    uint32_t rlen = GetLe<uint32_t>(in);
    in.remove_prefix(4);
    if (rlen > kBundleMaxRecordBytes || rlen > in.size()) {
      return absl::DataLossError(
          absl::StrCat("bundle: frame ", frame, ": record length ", rlen, " out of bounds"));
    }
    auto record = DecodeRecord(in.substr(0, rlen));
    if (!record.ok()) {
      return absl::DataLossError(
          absl::StrCat("bundle: frame ", frame, ": ", record.status().message()));
    }
    in.remove_prefix(rlen);
    if (in.size() < 8)
      return absl::DataLossError(absl::StrCat("bundle: frame ", frame, ": truncated"));
    uint64_t clen = GetLe<uint64_t>(in);
    in.remove_prefix(8);
    if (clen > in.size()) {
      return absl::DataLossError(
          absl::StrCat("bundle: frame ", frame, ": cubin length ", clen, " out of bounds"));
    }
    std::string_view cubin = in.substr(0, clen);
    in.remove_prefix(clen);
    if (record->cubin_size() != clen) {
      return absl::DataLossError(absl::StrCat("bundle: frame ", frame, ": cubin is ", clen,
                                              " bytes, record says ", record->cubin_size()));
    }
    if (AsBytes(Sha256(cubin)) != record->cubin_sha256()) {
      return absl::DataLossError(absl::StrCat("bundle: frame ", frame, " (key ",
                                              ToHex(record->key()),
                                              "): cubin does not match its SHA-256"));
    }
    out.push_back(BundleEntry{*std::move(record), cubin});
  }
  if (in.size() < 8 + 32) return absl::DataLossError("bundle: truncated trailer");
  uint64_t count = GetLe<uint64_t>(in);
  if (count != out.size()) {
    return absl::DataLossError(
        absl::StrCat("bundle: trailer counts ", count, " entries, found ", out.size()));
  }
  in.remove_prefix(8);
  std::string_view checksum = in.substr(0, 32);
  in.remove_prefix(32);
  if (!in.empty()) {
    return absl::DataLossError(absl::StrCat("bundle: ", in.size(), " bytes after the trailer"));
  }
  const std::string_view covered = all.substr(0, all.size() - 32);
  if (AsBytes(Sha256(covered)) != checksum) {
    return absl::DataLossError("bundle: checksum mismatch");
  }
  return out;
}

absl::StatusOr<std::string> ReadBundleFile(const std::string& path, uint64_t max_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string data;
  char buf[1 << 16];
  absl::Status st;
  for (;;) {
    size_t n = std::fread(buf, 1, sizeof(buf), f);
    data.append(buf, n);
    if (data.size() >= kBundleMagic.size() && !data.starts_with(kBundleMagic)) {
      st = absl::InvalidArgumentError(absl::StrCat(
          path, ": not a kcache bundle (it does not start with ", std::string(kBundleMagic), ")"));
      break;
    }
    if (data.size() > max_bytes) {
      st = absl::InvalidArgumentError(
          absl::StrCat(path, ": larger than ", max_bytes, " bytes, the most a bundle may hold"));
      break;
    }
    if (n < sizeof(buf)) {
      if (std::ferror(f)) st = absl::UnavailableError(absl::StrCat("cannot read ", path));
      break;
    }
  }
  std::fclose(f);
  if (!st.ok()) return st;
  return data;
}

}  // namespace kcache
