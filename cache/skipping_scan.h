// A RocksDB scan that steps over damaged blocks instead of ending at them:
// the store's admin scans, GC and eviction use it so that one unreadable
// table file does not stop them. Internal to the store (cache/store*.cc).
//
// Thread-compatible: one scan is used by one thread at a time; any number of
// scans may run concurrently over one DB.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rocksdb/db.h"

namespace kcache {

// Iterates one column family over [begin, end) (end empty = to the last
// key), stepping over what RocksDB cannot read: on a corruption error the
// scan resumes at the first key after the damaged block (found by bisection
// between the last key read and the damaged table file's largest key: a
// Seek fails exactly while it lands in the damaged block), and the skipped
// range is described in `unreadable`. Other errors end the scan (status()).
// `db` and `cf` are not owned and must outlive the scan; `unreadable` may
// be null.
class SkippingScan {
 public:
  SkippingScan(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* cf, std::string begin, std::string end,
               std::vector<std::string>* unreadable)
      : db_(db), cf_(cf), begin_(std::move(begin)), end_(std::move(end)), unreadable_(unreadable) {
    upper_ = rocksdb::Slice(end_);
    if (!end_.empty()) ro_.iterate_upper_bound = &upper_;
    it_.reset(db_->NewIterator(ro_, cf_));
  }
  void Start() {
    begin_.empty() ? it_->SeekToFirst() : it_->Seek(begin_);
    Settle();
  }
  bool Valid() const { return it_->Valid(); }
  void Next() {
    it_->Next();
    Settle();
  }
  rocksdb::Slice key() const { return it_->key(); }
  rocksdb::Slice value() const { return it_->value(); }
  // Non-corruption errors; OK when the scan ended normally or stepped over damage.
  const rocksdb::Status& status() const { return error_; }
  // The skipped key ranges [from, to) ("to" empty: to the end).
  const std::vector<std::pair<std::string, std::string>>& skipped() const { return skipped_; }

 private:
  void Settle();
  // True when Seek(k) fails on damage. A fresh iterator each time: one that
  // failed may answer a later Seek from the state of the failed one.
  bool Damaged(const std::string& k);
  // The first key after the damaged block; empty when none can be found
  // (the rest of the range is then unreadable).
  std::string ResumeAfter(const rocksdb::Status& st);

  rocksdb::DB* db_;
  rocksdb::ColumnFamilyHandle* cf_;
  std::string begin_, end_;
  rocksdb::Slice upper_;
  rocksdb::ReadOptions ro_;
  std::unique_ptr<rocksdb::Iterator> it_;
  std::vector<std::string>* unreadable_;
  std::string last_;
  bool have_last_ = false;
  rocksdb::Status error_;
  std::vector<std::pair<std::string, std::string>> skipped_;
};

}  // namespace kcache
