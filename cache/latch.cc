// Logical latches (see latch.h).
#include "cache/latch.h"

#include <algorithm>

#include "cache/string_view_compat.h"

namespace kcache {

void LatchTable::AcquireShared(std::string_view id) {
  absl::MutexLock l(&mu_);
  std::string key(id);
  auto free_of_exclusive = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = holders_.find(key);
    return it == holders_.end() || it->second >= 0;
  };
  mu_.Await(absl::Condition(&free_of_exclusive));
  ++holders_[key];
}

void LatchTable::ReleaseShared(std::string_view id) {
  absl::MutexLock l(&mu_);
  auto it = holders_.find(AbslView(id));
  if (it != holders_.end() && --it->second == 0) holders_.erase(it);
}

void LatchTable::AcquireExclusive(std::string_view id) {
  absl::MutexLock l(&mu_);
  std::string key(id);
  auto free = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !holders_.contains(key); };
  mu_.Await(absl::Condition(&free));
  holders_[key] = -1;
}

bool LatchTable::TryAcquireExclusive(std::string_view id) {
  absl::MutexLock l(&mu_);
  auto [it, inserted] = holders_.try_emplace(std::string(id), -1);
  return inserted;
}

void LatchTable::ReleaseExclusive(std::string_view id) {
  absl::MutexLock l(&mu_);
  holders_.erase(AbslView(id));
}

ExclusiveLatches::ExclusiveLatches(LatchTable& table, std::vector<std::string> ids)
    : table_(table), ids_(std::move(ids)) {
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
  for (const auto& id : ids_) table_.AcquireExclusive(id);
}

ExclusiveLatches::~ExclusiveLatches() {
  for (const auto& id : ids_) table_.ReleaseExclusive(id);
}

SharedLatches::SharedLatches(LatchTable& table, std::vector<std::string> ids)
    : table_(table), ids_(std::move(ids)) {
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
  for (const auto& id : ids_) table_.AcquireShared(id);
}

SharedLatches::~SharedLatches() {
  for (const auto& id : ids_) table_.ReleaseShared(id);
}

}  // namespace kcache
