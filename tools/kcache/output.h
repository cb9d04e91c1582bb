// Output helpers for `kcache`: aligned tables for people, JSON for scripts
// (protobuf messages with byte fields such as keys shown in hex), sizes and
// times in readable form, and a progress display that draws a bar on a
// terminal and prints plain lines otherwise. Not thread-safe: one writer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "google/protobuf/message.h"

namespace kcache::tools {

class Table {
 public:
  explicit Table(std::vector<std::string> header, std::vector<bool> right_aligned = {})
      : header_(std::move(header)), right_(std::move(right_aligned)) {}
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  size_t size() const { return rows_.size(); }
  // Columns separated by two spaces, padded to the widest cell; no trailing blanks.
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// The message in protobuf's JSON mapping (proto field names, defaults
// included, 64-bit integers as numbers), with the byte fields that hold keys and digests ("key",
// "cubin_sha256", "quarantined_keys", "key_prefix", "page_token",
// "next_page_token") as lower-case hex instead of base64.
nlohmann::json ProtoToJson(const google::protobuf::Message& m);

std::string HumanBytes(uint64_t bytes);        // "1.5 MiB"; exact below 1 KiB
std::string FormatUnixMs(int64_t unix_ms);     // "2026-11-30 12:00:03Z"; "-" for 0
std::string ShortKey(const std::string& key);  // first 28 hex digits of a binary key

// Progress of a batch of `total` steps on `err`. On a terminal, one line
// redrawn in place ("label [#####-----] 3/10 detail"); otherwise nothing
// (callers print one plain line per step instead).
class Progress {
 public:
  Progress(std::ostream& err, bool tty, std::string label, uint64_t total)
      : err_(err), tty_(tty), label_(std::move(label)), total_(total) {}
  bool tty() const { return tty_; }
  void Update(uint64_t done, const std::string& detail);
  // Clears the line (terminal only).
  void Finish();

 private:
  std::ostream& err_;
  const bool tty_;
  const std::string label_;
  const uint64_t total_;
  bool drawn_ = false;
};

}  // namespace kcache::tools
