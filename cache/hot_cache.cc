// LRU-by-bytes in-memory layer (see hot_cache.h).
#include "cache/hot_cache.h"

#include "cache/string_view_compat.h"

namespace kcache {

size_t HotCache::Charge(const Entry& e) {
  // Record size is an estimate (SpaceUsedLong would walk the message).
  return e.cubin.size() + e.record.compile_log().size() + 512;
}

EntryRef HotCache::Get(std::string_view key) {
  if (capacity_ == 0) return nullptr;
  absl::MutexLock l(&mu_);
  auto it = index_.find(AbslView(key));
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->entry;
}

uint64_t HotCache::Generation() {
  absl::MutexLock l(&mu_);
  return generation_;
}

void HotCache::Insert(std::string_view key, EntryRef entry, uint64_t generation) {
  if (capacity_ == 0 || entry == nullptr) return;
  size_t charge = Charge(*entry);
  if (charge > capacity_) return;
  absl::MutexLock l(&mu_);
  if (generation != generation_) return;
  if (auto it = index_.find(AbslView(key)); it != index_.end()) EraseLocked(it->second);
  lru_.push_front(Node{std::string(key), std::move(entry), charge});
  index_.emplace(lru_.front().key, lru_.begin());
  bytes_ += charge;
  while (bytes_ > capacity_ && !lru_.empty()) EraseLocked(std::prev(lru_.end()));
}

void HotCache::EraseLocked(List::iterator it) {
  bytes_ -= it->charge;
  index_.erase(it->key);
  lru_.erase(it);
}

void HotCache::Erase(std::string_view key) {
  absl::MutexLock l(&mu_);
  ++generation_;
  if (auto it = index_.find(AbslView(key)); it != index_.end()) EraseLocked(it->second);
}

void HotCache::EraseIf(absl::FunctionRef<bool(std::string_view, const Entry&)> pred) {
  absl::MutexLock l(&mu_);
  ++generation_;
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (pred(it->key, *it->entry)) EraseLocked(it);
    it = next;
  }
}

size_t HotCache::bytes() {
  absl::MutexLock l(&mu_);
  return bytes_;
}

size_t HotCache::size() {
  absl::MutexLock l(&mu_);
  return index_.size();
}

}  // namespace kcache
