#include "cache/remote/redis_client.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <iostream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kcache {

namespace {

void FreeContext(redisContext* c) {
  if (c != nullptr) redisFree(c);
}

// The one adapter from hiredis's reply object to ours.
RedisReply CopyReply(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(CopyReply(r->element[i]));
      break;
    default:
      out.type = RedisReply::Type::kNil;
  }
  return out;
}

// Runs one command on `c`. `io_error` is set when the connection is unusable.
absl::StatusOr<RedisReply> RunOn(redisContext* c, const std::vector<std::string>& argv,
                                 bool* io_error) {
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* reply = static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), ptrs.data(), lens.data()));
  if (reply == nullptr) {
    *io_error = true;
    return absl::UnavailableError(
        absl::StrCat("redis: ", c->err != 0 ? c->errstr : "no reply", " (", argv[0], ")"));
  }
  absl::StatusOr<RedisReply> out;
  if (reply->type == REDIS_REPLY_ERROR) {
    out = absl::FailedPreconditionError(
        absl::StrCat("redis: ", std::string(reply->str, reply->len), " (", argv[0], ")"));
  } else {
    out = CopyReply(reply);
  }
  freeReplyObject(reply);
  return out;
}

}  // namespace

std::string RedisAddress::ToString() const {
  return absl::StrCat("redis://", host, ":", port, db != 0 ? absl::StrCat("/", db) : "");
}

absl::StatusOr<RedisAddress> ParseRedisUrl(absl::string_view url) {
  constexpr absl::string_view kScheme = "redis://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote: '", url, "' is not redis://HOST:PORT[/DB]"));
  }
  absl::string_view rest = url.substr(kScheme.size());
  if (absl::StrContains(rest, '@')) {
    return absl::InvalidArgumentError(
        "remote: no credentials in the URL; put the password in remote_password_file");
  }
  RedisAddress a;
  if (size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    absl::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!absl::SimpleAtoi(db, &a.db) || a.db < 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("remote: database '", db, "' is not a number"));
    }
    rest = rest.substr(0, slash);
  }
  if (size_t colon = rest.rfind(':'); colon != absl::string_view::npos) {
    absl::string_view port = rest.substr(colon + 1);
    if (!absl::SimpleAtoi(port, &a.port) || a.port <= 0 || a.port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("remote: port '", port, "' is not a port"));
    }
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) return absl::InvalidArgumentError("remote: no host in the URL");
  a.host = std::string(rest);
  return a;
}

RedisClient::RedisClient(RedisClientOptions options) : options_(std::move(options)) {
  reconnect_ = std::thread([this] { ReconnectLoop(); });
}

RedisClient::~RedisClient() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  reconnect_.join();
}

absl::StatusOr<RedisClient::ConnPtr> RedisClient::Connect() const {
  const RedisAddress& a = options_.address;
  ConnPtr c(redisConnectWithTimeout(a.host.c_str(), a.port, absl::ToTimeval(options_.timeout)),
            &FreeContext);
  if (c == nullptr) return absl::UnavailableError("redis: cannot allocate a connection");
  if (c->err != 0) {
    return absl::UnavailableError(absl::StrCat("redis: connect ", a.ToString(), ": ", c->errstr));
  }
  if (redisSetTimeout(c.get(), absl::ToTimeval(options_.timeout)) != REDIS_OK) {
    return absl::UnavailableError(absl::StrCat("redis: set timeout: ", c->errstr));
  }
  bool io_error = false;
  if (!options_.password.empty()) {
    auto r = RunOn(c.get(), {"AUTH", options_.password}, &io_error);
    if (!r.ok()) return absl::UnavailableError(absl::StrCat("redis: AUTH: ", r.status().message()));
  }
  if (a.db != 0) {
    auto r = RunOn(c.get(), {"SELECT", absl::StrCat(a.db)}, &io_error);
    if (!r.ok())
      return absl::UnavailableError(absl::StrCat("redis: SELECT: ", r.status().message()));
  }
  return c;
}

absl::StatusOr<RedisClient::ConnPtr> RedisClient::Checkout() {
  {
    absl::MutexLock lock(&mu_);
    if (!up_) {
      return absl::UnavailableError(
          absl::StrCat("redis: ", options_.address.ToString(), " is down (", last_error_, ")"));
    }
    if (!idle_.empty()) {
      ConnPtr c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
  }
  auto c = Connect();  // no lock held: this is I/O
  if (!c.ok()) MarkDown(std::string(c.status().message()));
  return c;
}

void RedisClient::Return(ConnPtr conn) {
  absl::MutexLock lock(&mu_);
  if (up_ && static_cast<int>(idle_.size()) < options_.max_idle_connections) {
    idle_.push_back(std::move(conn));
  }
  // Otherwise `conn` closes here; closing a socket does not block.
}

void RedisClient::MarkDown(const std::string& why) {
  std::vector<ConnPtr> drop;
  {
    absl::MutexLock lock(&mu_);
    if (up_) {
      std::cerr << "kcached: remote tier " << options_.address.ToString()
                << " unavailable, continuing locally: " << why << std::endl;
    }
    up_ = false;
    last_error_ = why;
    drop.swap(idle_);  // their peer is probably gone too
  }
}

absl::StatusOr<RedisReply> RedisClient::Command(const std::vector<std::string>& argv) {
  auto conn = Checkout();
  if (!conn.ok()) return conn.status();
  bool io_error = false;
  auto reply = RunOn(conn->get(), argv, &io_error);
  if (io_error) {
    MarkDown(std::string(reply.status().message()));
  } else {
    Return(*std::move(conn));
  }
  return reply;
}

bool RedisClient::connected() const {
  absl::MutexLock lock(&mu_);
  return up_;
}

std::string RedisClient::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

uint64_t RedisClient::reconnects() const {
  absl::MutexLock lock(&mu_);
  return reconnects_;
}

void RedisClient::ReconnectLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (!up_) {
      mu_.Unlock();  // connecting is I/O
      absl::StatusOr<ConnPtr> c = Connect();
      bool io_error = false;
      if (c.ok()) {
        if (auto pong = RunOn(c->get(), {"PING"}, &io_error); !pong.ok()) c = pong.status();
      }
      mu_.Lock();
      if (c.ok()) {
        up_ = true;
        if (ever_up_) ++reconnects_;
        std::cerr << "kcached: remote tier " << options_.address.ToString()
                  << (ever_up_ ? " reconnected" : " connected") << std::endl;
        ever_up_ = true;
        last_error_.clear();
        idle_.push_back(*std::move(c));
      } else {
        last_error_ = std::string(c.status().message());
      }
    }
    // Wakes early on stop_ or when a caller marks the client down.
    if (up_) {
      mu_.Await(absl::Condition(this, &RedisClient::StopOrDown));
    } else {
      mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.reconnect_interval);
    }
  }
  idle_.clear();
}

}  // namespace kcache
