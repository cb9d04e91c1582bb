// The store's admin reads and marks: scans (List, Stats, ResolveKeyPrefix),
// Inspect, Verify (every blob re-hashed) and pins.
#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "cache/record_codec.h"
#include "cache/rocks_status.h"
#include "cache/skipping_scan.h"
#include "cache/store.h"
#include "cache/store_internal.h"
#include "cache/string_view_compat.h"
#include "rocksdb/db.h"

namespace kcache {

using store_internal::DecodeRecordAt;
using store_internal::S;
using store_internal::StartsWith;
using store_internal::V;

absl::StatusOr<v1::VerifyResponse> Store::Verify() {
  v1::VerifyResponse out;
  std::vector<std::string> unreadable;
  auto scanned = ScanRecords(
      {}, {}, [](const v1::KernelRecord&) { return true; }, &unreadable);
  if (!scanned.ok()) return scanned.status();
  for (auto& u : unreadable) out.add_unreadable(std::move(u));
  // One hash per distinct blob; the verdict is shared by every record naming it.
  absl::flat_hash_map<std::string, std::string> bad;  // digest -> reason
  absl::flat_hash_set<std::string> good;
  for (auto& e : *scanned) {
    out.set_checked(out.checked() + 1);
    std::string reason;
    if (!e.decoded) {
      reason = std::string(DecodeRecordAt(e.key, e.raw).status().message());
    } else if (good.contains(e.record.cubin_sha256())) {
      continue;
    } else if (auto it = bad.find(e.record.cubin_sha256()); it != bad.end()) {
      reason = it->second;
    } else {
      auto cubin = ReadVerifiedBlob(e.record);
      if (cubin.ok()) {
        good.insert(e.record.cubin_sha256());
        continue;
      }
      if (!absl::IsDataLoss(cubin.status())) return cubin.status();
      reason = std::string(cubin.status().message());
      bad.emplace(e.record.cubin_sha256(), reason);
    }
    out.set_corrupt(out.corrupt() + 1);
    out.add_quarantined_keys(e.key);
    Quarantine(e.key, e.decoded ? e.record : v1::KernelRecord(), reason);
  }
  return out;
}

// --- Scans, listing, stats ---------------------------------------------------

absl::StatusOr<std::vector<Store::Scanned>> Store::ScanRecords(
    std::string_view begin, std::string_view end,
    absl::FunctionRef<bool(const v1::KernelRecord&)> pred, std::vector<std::string>* unreadable) {
  std::vector<Scanned> out;
  SkippingScan it(db_, cf_records_, std::string(begin), std::string(end), unreadable);
  for (it.Start(); it.Valid(); it.Next()) {
    Scanned s;
    s.key = std::string(V(it.key()));
    s.raw = std::string(V(it.value()));
    auto r = DecodeRecordAt(s.key, s.raw);
    if (r.ok()) {
      s.decoded = true;
      s.record = *std::move(r);
      if (!pred(s.record)) continue;
    }
    out.push_back(std::move(s));
  }
  if (auto st = FromRocks(it.status(), "scan records"); !st.ok()) return st;
  return out;
}

absl::StatusOr<v1::ListResponse> Store::List(const v1::Filter& filter, uint32_t page_size,
                                             std::string_view page_token) {
  if (page_size == 0) page_size = 100;
  page_size = std::min<uint32_t>(page_size, 1000);
  std::string begin, end;
  auto narrow = [&](const std::string& b, const std::string& e) {
    begin = std::max(begin, b);
    if (!e.empty() && (end.empty() || e < end)) end = e;
  };
  if (!filter.toolchain_id().empty()) {
    auto raw = ParseToolchainIdHex(filter.toolchain_id());
    if (!raw.ok())
      return absl::InvalidArgumentError(absl::StrCat("filter.", raw.status().message()));
    auto r = ToolchainRange(*raw);
    narrow(r.begin, r.end);
  }
  if (!filter.key_prefix().empty()) {
    narrow(filter.key_prefix(), PrefixSuccessor(filter.key_prefix()));
  }
  if (!page_token.empty()) {
    if (auto s = ValidateKey(page_token); !s.ok()) {
      return absl::InvalidArgumentError("page_token: not a token from a previous page");
    }
    narrow(std::string(page_token) + '\0', "");
  }
  if (!end.empty() && begin >= end) return v1::ListResponse();

  v1::ListResponse out;
  std::vector<std::string> unreadable;
  SkippingScan scan(db_, cf_records_, begin, end, &unreadable);
  SkippingScan* it = &scan;
  for (it->Start(); it->Valid(); it->Next()) {
    auto r = DecodeRecordAt(V(it->key()), V(it->value()));
    if (!r.ok()) continue;  // undecodable records are Verify's business
    if (!filter.arch().empty() && r->arch() != filter.arch()) continue;
    if (!filter.mask_kind().empty() && MaskKind(*r) != filter.mask_kind()) continue;
    if (filter.created_before_unix_ms() != 0 &&
        r->created_unix_ms() >= filter.created_before_unix_ms()) {
      continue;
    }
    auto pinned_or = IsPinned(V(it->key()));
    if (!pinned_or.ok()) return pinned_or.status();
    const bool pinned = *pinned_or;
    if (filter.pinned() == v1::Filter::PINNED_ONLY && !pinned) continue;
    if (filter.pinned() == v1::Filter::PINNED_NONE && pinned) continue;
    auto stats = ReadAccessStats(V(it->key()));
    if (!stats.ok()) return stats.status();
    if (filter.unused_since_unix_ms() != 0 &&
        stats->last_used_unix_ms() >= filter.unused_since_unix_ms()) {
      continue;
    }
    if (static_cast<uint32_t>(out.entries_size()) == page_size) {
      // One more match exists: the page is full and another follows.
      out.set_next_page_token(out.entries(out.entries_size() - 1).record().key());
      break;
    }
    auto* e = out.add_entries();
    *e->mutable_record() = *std::move(r);
    *e->mutable_access() = *std::move(stats);
    e->set_pinned(pinned);
  }
  if (auto st = FromRocks(it->status(), "list"); !st.ok()) return st;
  for (auto& u : unreadable) out.add_unreadable(std::move(u));
  return out;
}

absl::StatusOr<std::optional<v1::EntrySummary>> Store::Inspect(std::string_view key) {
  if (auto s = ValidateKey(key); !s.ok()) return s;
  std::string raw;
  auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(key), &raw);
  if (rs.IsNotFound()) return std::optional<v1::EntrySummary>();
  if (auto st = FromRocks(rs, "inspect"); !st.ok()) return st;
  auto r = DecodeRecord(raw);
  if (!r.ok()) return r.status();
  v1::EntrySummary e;
  *e.mutable_record() = *std::move(r);
  auto stats = ReadAccessStats(key);
  if (!stats.ok()) return stats.status();
  *e.mutable_access() = *std::move(stats);
  auto pinned = IsPinned(key);
  if (!pinned.ok()) return pinned.status();
  e.set_pinned(*pinned);
  return std::optional<v1::EntrySummary>(std::move(e));
}

absl::StatusOr<std::string> Store::ResolveKeyPrefix(std::string_view hex_prefix) {
  auto prefix = ParseHexKeyPrefix(hex_prefix);
  if (!prefix.ok()) return prefix.status();
  std::vector<std::string> found;
  SkippingScan scan(db_, cf_records_, prefix->bytes, PrefixSuccessor(prefix->bytes), nullptr);
  SkippingScan* it = &scan;
  for (it->Start(); it->Valid() && found.size() < 2; it->Next()) {
    std::string_view k = V(it->key());
    if (!StartsWith(k, prefix->bytes)) break;
    if (prefix->Matches(k)) found.emplace_back(k);
  }
  if (auto st = FromRocks(it->status(), "resolve key prefix"); !st.ok()) return st;
  if (found.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no entry has a key starting with ", AbslView(hex_prefix)));
  }
  if (found.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("key prefix ", AbslView(hex_prefix),
                                                   " is ambiguous (matches several entries)"));
  }
  return found[0];
}

absl::StatusOr<v1::StatsResponse> Store::Stats() {
  v1::StatsResponse out;
  std::map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> groups;
  absl::flat_hash_map<std::string, uint64_t> blobs;
  std::vector<std::string> unreadable;
  {
    SkippingScan it(db_, cf_records_, "", "", &unreadable);
    for (it.Start(); it.Valid(); it.Next()) {
      auto r = DecodeRecordAt(V(it.key()), V(it.value()));
      if (!r.ok()) continue;
      out.set_entries(out.entries() + 1);
      auto& g = groups[{ToHex(KeyToolchainId(r->key())), r->arch()}];
      g.first += 1;
      g.second += r->cubin_size();
      blobs.emplace(r->cubin_sha256(), r->cubin_size());
    }
    if (auto st = FromRocks(it.status(), "stats"); !st.ok()) return st;
  }
  for (const auto& [d, size] : blobs) out.set_blob_bytes(out.blob_bytes() + size);
  out.set_blobs(blobs.size());
  for (const auto& [k, v] : groups) {
    auto* g = out.add_groups();
    g->set_toolchain_id(k.first);
    g->set_arch(k.second);
    g->set_entries(v.first);
    g->set_bytes(v.second);
  }
  {
    SkippingScan it(db_, cf_pins_, "", "", &unreadable);
    for (it.Start(); it.Valid(); it.Next()) {
      std::string v;
      auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, it.key(), &v);
      if (rs.ok()) out.set_pinned(out.pinned() + 1);
    }
    if (auto st = FromRocks(it.status(), "stats"); !st.ok()) return st;
  }
  {
    SkippingScan it(db_, cf_quarantine_, "", "", &unreadable);
    for (it.Start(); it.Valid(); it.Next()) out.set_quarantined(out.quarantined() + 1);
    if (auto st = FromRocks(it.status(), "stats"); !st.ok()) return st;
  }
  for (auto& u : unreadable) out.add_unreadable(std::move(u));
  out.set_store_damage(damage());
  return out;
}

// --- Pins --------------------------------------------------------------------

absl::Status Store::Pin(std::string_view key, std::string_view reason) {
  if (auto s = CheckWritable("pin"); !s.ok()) return s;
  if (auto s = ValidateKey(key); !s.ok()) return s;
  // Under the key latch, so that an eviction cannot remove the entry between
  // the check and the pin (evict re-reads pins under the same latch).
  ExclusiveLatches hold(key_latches_, {std::string(key)});
  std::string raw;
  auto rs = db_->Get(rocksdb::ReadOptions(), cf_records_, S(key), &raw);
  if (rs.IsNotFound()) {
    return absl::NotFoundError(absl::StrCat("pin: no entry ", KeyToHex(key)));
  }
  if (auto st = FromRocks(rs, "pin"); !st.ok()) return st;
  v1::PinInfo p;
  p.set_pinned_unix_ms(Now());
  p.set_reason(std::string(reason));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Put(wo, cf_pins_, S(key), p.SerializeAsString()), "pin");
}

absl::Status Store::Unpin(std::string_view key) {
  if (auto s = CheckWritable("unpin"); !s.ok()) return s;
  if (auto s = ValidateKey(key); !s.ok()) return s;
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Delete(wo, cf_pins_, S(key)), "unpin");
}

absl::StatusOr<bool> Store::IsPinned(std::string_view key) {
  std::string v;
  auto rs = db_->Get(rocksdb::ReadOptions(), cf_pins_, S(key), &v);
  if (rs.IsNotFound()) return false;
  // A pin that cannot be read counts as a pin: eviction must not guess.
  if (rs.IsCorruption()) return true;
  if (auto st = FromRocks(rs, "read pin"); !st.ok()) return st;
  return true;
}

}  // namespace kcache
