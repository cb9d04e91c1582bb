// The store's RocksDB info log (see tolerant_logger.h).
#include "cache/tolerant_logger.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kcache {
namespace {

class TolerantLogger final : public rocksdb::Logger {
 public:
  explicit TolerantLogger(std::string path)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), path_(std::move(path)) {
    Reopen();
  }
  ~TolerantLogger() override {
    if (fd_ >= 0) ::close(fd_);
  }

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    static const char* const kNames[] = {"DEBUG", "INFO", "WARN", "ERROR", "FATAL", "HEADER"};
    char buf[2048];
    const absl::Time now = absl::Now();
    int n =
        std::snprintf(buf, sizeof(buf), "%s [%s] ",
                      absl::FormatTime("%Y/%m/%d-%H:%M:%E6S", now, absl::LocalTimeZone()).c_str(),
                      kNames[std::min<int>(level, 5)]);
    if (n < 0) return;
    va_list copy;
    va_copy(copy, ap);
    int m = std::vsnprintf(buf + n, sizeof(buf) - static_cast<size_t>(n) - 1, format, copy);
    va_end(copy);
    if (m < 0) return;
    size_t len = std::min(sizeof(buf) - 2, static_cast<size_t>(n) + static_cast<size_t>(m));
    if (buf[len - 1] != '\n') buf[len++] = '\n';
    Write(buf, len);
    if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL &&
        level != rocksdb::InfoLogLevel::HEADER_LEVEL) {
      const int64_t sec = absl::ToUnixSeconds(now);
      if (last_stderr_sec_.exchange(sec) != sec) {
        (void)!::write(2, "kcache store (rocksdb): ", 24);
        (void)!::write(2, buf + n, len - static_cast<size_t>(n));
      }
    }
  }

 private:
  void Reopen() {
    if (path_.empty()) return;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat st {};
    written_ = fd_ >= 0 && ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  void Write(const char* p, size_t n) {
    absl::MutexLock l(&mu_);
    if (fd_ < 0) return;
    if (written_ > (uint64_t{16} << 20)) {
      ::close(fd_);
      fd_ = -1;
      (void)std::rename(path_.c_str(), (path_ + ".old").c_str());
      Reopen();
      if (fd_ < 0) return;
    }
    ssize_t w = ::write(fd_, p, n);  // a failed line is dropped
    if (w > 0) written_ += static_cast<uint64_t>(w);
  }

  const std::string path_;
  absl::Mutex mu_;
  int fd_ = -1;
  uint64_t written_ = 0;
  std::atomic<int64_t> last_stderr_sec_{0};
};

}  // namespace

std::shared_ptr<rocksdb::Logger> NewTolerantLogger(std::string path) {
  return std::make_shared<TolerantLogger>(std::move(path));
}

}  // namespace kcache
