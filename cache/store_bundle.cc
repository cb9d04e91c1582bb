// The store's bundles: Export (every blob digest-checked, written through
// cache/bundle.h) and Import (the whole bundle validated before one write).
#include <cstdio>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cache/bundle.h"
#include "cache/key.h"
#include "cache/rocks_status.h"
#include "cache/store.h"
#include "cache/store_internal.h"
#include "cache/string_view_compat.h"
#include "rocksdb/db.h"

namespace kcache {

using store_internal::S;

absl::StatusOr<ExportResult> Store::Export(const v1::Filter& filter,
                                           absl::FunctionRef<absl::Status(std::string_view)> sink) {
  ExportResult result;
  BundleWriter writer([&](std::string_view piece) { return sink(piece); });
  if (auto s = writer.Begin(); !s.ok()) return s;
  std::string token;
  do {
    auto page = List(filter, 1000, token);
    if (!page.ok()) return page.status();
    for (const auto& u : page->unreadable()) result.unreadable.push_back(u);
    for (const auto& e : page->entries()) {
      auto cubin = ReadVerifiedBlob(e.record());
      if (!cubin.ok()) {
        if (!absl::IsDataLoss(cubin.status())) return cubin.status();
        Quarantine(e.record().key(), e.record(), std::string(cubin.status().message()));
        result.quarantined_keys.push_back(e.record().key());
        continue;
      }
      if (auto s = writer.Add(e.record(), *cubin); !s.ok()) return s;
    }
    token = page->next_page_token();
  } while (!token.empty());
  if (auto s = writer.Finish(); !s.ok()) return s;
  result.exported = writer.count();
  return result;
}

absl::StatusOr<ExportResult> Store::ExportToFile(const v1::Filter& filter,
                                                 const std::string& path) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("export: cannot create ", tmp));
  }
  auto result = Export(filter, [&](std::string_view piece) {
    if (std::fwrite(piece.data(), 1, piece.size(), f) != piece.size()) {
      return absl::UnavailableError(absl::StrCat("export: write to ", tmp, " failed"));
    }
    return absl::OkStatus();
  });
  const bool closed = std::fclose(f) == 0;
  if (result.ok() && !closed) result = absl::UnavailableError("export: closing the file failed");
  if (result.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    result = absl::UnavailableError(absl::StrCat("export: cannot rename ", tmp, " to ", path));
  }
  if (!result.ok()) std::remove(tmp.c_str());
  return result;
}

absl::StatusOr<v1::ImportResponse> Store::Import(std::string_view bundle,
                                                 const ImportOptions& options) {
  if (auto s = CheckWritable("import"); !s.ok()) return s;
  std::string expected;
  if (!options.allow_foreign_toolchain) {
    if (options.expected_toolchain_id.empty()) {
      return absl::InvalidArgumentError(
          "import: expected_toolchain_id is required unless allow_foreign_toolchain is set");
    }
    auto raw = ParseToolchainIdHex(options.expected_toolchain_id);
    if (!raw.ok()) return raw.status();
    expected = *std::move(raw);
  }
  // Validate everything before writing anything.
  auto entries = DecodeBundle(bundle);
  if (!entries.ok()) return entries.status();
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < entries->size(); ++i) {
    const auto& r = (*entries)[i].record;
    if (!expected.empty() && KeyToolchainId(r.key()) != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "import: bundle entry ", i, " belongs to toolchain ", ToHex(KeyToolchainId(r.key())),
          ", not the current ", options.expected_toolchain_id,
          " (set allow_foreign_toolchain to import it anyway)"));
    }
    if (!seen.insert(r.key()).second) {
      return absl::DataLossError(
          absl::StrCat("bundle: entry ", i, ": duplicate key ", KeyToHex(r.key())));
    }
  }
  v1::ImportResponse out;
  std::vector<Prepared> items;
  for (auto& e : *entries) {
    std::string raw;
    auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(e.record.key()), &raw);
    if (rs.ok()) {
      v1::KernelRecord cur;
      if (cur.ParseFromString(raw) && cur.cubin_sha256() == e.record.cubin_sha256()) {
        out.set_already_present(out.already_present() + 1);
        continue;
      }
    } else if (!rs.IsNotFound()) {
      return FromRocks(rs, "import");
    }
    Prepared p;
    p.digest = e.record.cubin_sha256();
    p.record_bytes = e.record.SerializeAsString();
    p.record = std::move(e.record);
    p.external = true;
    p.external_cubin = e.cubin;
    items.push_back(std::move(p));
  }
  if (!items.empty()) {
    hot_.EraseIf([&](std::string_view k, const Entry&) { return seen.contains(AbslView(k)); });
    if (auto s = WritePrepared(items, /*sync=*/true); !s.ok()) return s;
  }
  out.set_imported(items.size());
  return out;
}

absl::StatusOr<v1::ImportResponse> Store::ImportFile(const std::string& path,
                                                     const ImportOptions& options) {
  auto data = ReadBundleFile(path);
  if (!data.ok()) {
    return absl::Status(data.status().code(), absl::StrCat("import: ", data.status().message()));
  }
  return Import(*data, options);
}

}  // namespace kcache
