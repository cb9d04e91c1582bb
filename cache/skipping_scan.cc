// The store's damage-tolerant scan (see skipping_scan.h).
#include "cache/skipping_scan.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cache/digest.h"
#include "cache/string_view_compat.h"
#include "rocksdb/metadata.h"

namespace kcache {
namespace {

// The file number in a RocksDB corruption message ("... in /s/000123.sst
// offset 0 size 4096"); 0 when there is none.
uint64_t SstNumberIn(std::string_view msg) {
  size_t pos = msg.find(".sst");
  if (pos == std::string_view::npos) return 0;
  size_t b = pos;
  while (b > 0 && msg[b - 1] >= '0' && msg[b - 1] <= '9') --b;
  uint64_t n = 0;
  if (b == pos || !absl::SimpleAtoi(AbslView(msg.substr(b, pos - b)), &n)) return 0;
  return n;
}

uint64_t SstNumberOfName(const std::string& name) { return SstNumberIn(name); }

// Big-endian midpoint floor((a + b) / 2) of two byte strings of one length.
std::string Midpoint(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  std::vector<unsigned> sum(n + 1, 0);
  unsigned carry = 0;
  for (size_t i = n; i-- > 0;) {
    unsigned v = static_cast<unsigned char>(a[i]) + static_cast<unsigned char>(b[i]) + carry;
    sum[i + 1] = v & 0xff;
    carry = v >> 8;
  }
  sum[0] = carry;
  std::string out(n, '\0');
  unsigned rem = 0;
  for (size_t i = 0; i <= n; ++i) {
    unsigned v = rem * 256 + sum[i];
    if (i > 0) out[i - 1] = static_cast<char>(v / 2);
    rem = v % 2;
  }
  return out;
}

}  // namespace

void SkippingScan::Settle() {
  while (!it_->Valid() && !it_->status().ok()) {
    const rocksdb::Status st = it_->status();
    if (!st.IsCorruption() || skipped_.size() > 1000) {
      error_ = st;
      return;
    }
    std::string resume = ResumeAfter(st);
    const std::string from = have_last_ ? last_ + '\0' : begin_;
    skipped_.emplace_back(from, resume);
    if (unreadable_ != nullptr) {
      unreadable_->push_back(absl::StrCat(
          cf_->GetName(), ": keys ",
          have_last_ ? absl::StrCat("after ", ToHex(last_)) : std::string("from the start"), " ",
          resume.empty() ? std::string("to the end") : absl::StrCat("up to ", ToHex(resume)), ": ",
          st.ToString()));
    }
    if (resume.empty()) return;  // the rest cannot be read
    it_.reset(db_->NewIterator(ro_, cf_));
    it_->Seek(resume);
  }
  if (it_->Valid()) {
    last_.assign(it_->key().data(), it_->key().size());
    have_last_ = true;
  }
}

bool SkippingScan::Damaged(const std::string& k) {
  std::unique_ptr<rocksdb::Iterator> probe(db_->NewIterator(ro_, cf_));
  probe->Seek(k);
  return !probe->Valid() && probe->status().IsCorruption();
}

std::string SkippingScan::ResumeAfter(const rocksdb::Status& st) {
  std::string hi;  // a key past the damage
  if (const uint64_t bad = SstNumberIn(st.ToString()); bad != 0) {
    std::vector<rocksdb::LiveFileMetaData> files;
    db_->GetLiveFilesMetaData(&files);
    for (const auto& f : files) {
      if (f.column_family_name == cf_->GetName() && SstNumberOfName(f.name) == bad) {
        hi = f.largestkey + '\0';
      }
    }
  }
  if (hi.empty() || Damaged(hi)) {
    hi = std::string(std::max<size_t>(64, last_.size() + 1), '\xff');
    if (Damaged(hi)) return "";
  }
  std::string lo = have_last_ ? last_ : begin_;
  const size_t n = std::max(lo.size(), hi.size());
  lo.resize(n, '\0');
  hi.resize(n, '\0');
  if (!(lo < hi)) return "";
  // Invariant: Seek(lo) lands in the damage (or lo is the last key read);
  // Seek(hi) does not.
  for (;;) {
    std::string mid = Midpoint(lo, hi);
    if (mid == lo) break;
    (Damaged(mid) ? lo : hi) = std::move(mid);
  }
  if (!end_.empty() && hi >= end_) return "";
  return hi;
}

}  // namespace kcache
