// A small, thread-safe Redis client over Debian's hiredis (synchronous API):
// a pool of connections, a bounded timeout on every call, and a background
// reconnect loop, so that a node whose Redis is down or slow keeps going.
//
// Thread safety: every method may be called from any thread. The pool's mutex
// guards only the list of idle connections and the health flag; it is never
// held across network I/O (a call checks a connection out, talks, and puts it
// back).
//
// Failure model: any I/O error or timeout closes that connection, marks the
// client "down" and wakes the reconnect thread; while down, calls fail at once
// with Unavailable (no connect attempt on the caller's thread). The reconnect
// thread retries every `reconnect_interval` until a PING answers, then marks
// the client up again. Error replies from Redis (e.g. WRONGTYPE, NOSCRIPT) are
// not connection failures: they come back as FailedPrecondition.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

struct redisContext;

namespace kcache {

// redis://HOST:PORT[/DB], parsed.
struct RedisAddress {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string ToString() const;  // the URL again, for logs and stats
};

// InvalidArgument naming the problem ("remote: ..."). Only the redis://
// scheme; no user or password in the URL (passwords come from a file).
absl::StatusOr<RedisAddress> ParseRedisUrl(absl::string_view url);

struct RedisClientOptions {
  RedisAddress address;
  std::string password;  // AUTH on connect when not empty
  // Bound on connect and on each command's round trip.
  absl::Duration timeout = absl::Milliseconds(250);
  absl::Duration reconnect_interval = absl::Seconds(1);
  int max_idle_connections = 16;
};

// One reply, copied out of hiredis's reply object.
struct RedisReply {
  enum class Type { kNil, kString, kInteger, kStatus, kArray };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus
  int64_t integer = 0;
  std::vector<RedisReply> elements;  // kArray
  bool is_nil() const { return type == Type::kNil; }
};

class RedisClient {
 public:
  // Starts the reconnect thread and tries one connection on it (the caller
  // does not wait for Redis): the client starts "down" until that succeeds.
  explicit RedisClient(RedisClientOptions options);
  ~RedisClient();  // joins the reconnect thread, closes every connection
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Sends one command (binary-safe arguments) and returns its reply.
  // Unavailable: down, connect failed, I/O error or timeout.
  // FailedPrecondition: Redis answered with an error reply (its text).
  absl::StatusOr<RedisReply> Command(const std::vector<std::string>& argv);

  bool connected() const;
  // The last connection error ("" when none since the last success).
  std::string last_error() const;
  uint64_t reconnects() const;  // successful reconnects after being down
  const RedisAddress& address() const { return options_.address; }

 private:
  using ConnPtr = std::unique_ptr<redisContext, void (*)(redisContext*)>;

  // Connects, authenticates, selects the DB. No lock held.
  absl::StatusOr<ConnPtr> Connect() const;
  // Takes an idle connection or opens one; Unavailable when down.
  absl::StatusOr<ConnPtr> Checkout();
  void Return(ConnPtr conn);
  void MarkDown(const std::string& why);
  void ReconnectLoop();
  bool StopOrDown() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !up_; }

  const RedisClientOptions options_;

  mutable absl::Mutex mu_;
  std::vector<ConnPtr> idle_ ABSL_GUARDED_BY(mu_);
  bool up_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  uint64_t reconnects_ ABSL_GUARDED_BY(mu_) = 0;
  bool ever_up_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reconnect_;
};

}  // namespace kcache
