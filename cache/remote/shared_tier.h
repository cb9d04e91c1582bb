// The interface of a shared second tier behind a node's store: what the
// daemon's compile path needs from it (look up, coordinate one compile per
// key across nodes, publish), with nothing of Redis in it, so that the
// kernel backend and its tests do not depend on a client library.
//
// Contract for implementations: thread-safe; every call is bounded in time
// and never fails the caller. A tier that is down, slow or returns bad data
// answers "not found" / "compile alone" and counts the problem: a node with
// a broken tier behaves as a node without one.
#pragma once

#include <memory>
#include <string_view>

#include "absl/time/time.h"
#include "cache/entry.h"
#include "kcache/v1/service.pb.h"

namespace kcache {

class SharedTier {
 public:
  // The right to compile one key for the fleet. Destroying it releases it
  // (publish first, so that waiters find the result).
  class Lease {
   public:
    virtual ~Lease() = default;
  };

  // The outcome of ClaimCompile: exactly one of
  //   entry set:  another node published the kernel meanwhile; use it;
  //   lease set:  this node compiles, then publishes, then drops the lease;
  //   neither:    compile alone (tier down, or the wait ran out of time).
  struct Claim {
    EntryRef entry;
    std::unique_ptr<Lease> lease;
  };

  virtual ~SharedTier() = default;

  // The entry under `key` (a store key, cache/key.h), verified as a local
  // read is: record decodes and is valid, is the record of exactly `key`,
  // cubin's SHA-256 and size match the record. nullptr when absent, bad
  // (counted, never returned) or the tier is unreachable.
  virtual EntryRef Fetch(std::string_view key) = 0;

  // Before compiling `key`: takes the fleet lease, or waits (no later than
  // `wait_until`) for the node that holds it to publish, taking over if its
  // lease expires.
  virtual Claim ClaimCompile(std::string_view key, absl::Time wait_until) = 0;

  // After a local compile, verify and publish: writes the cubin, then the
  // record (so a reader never finds a record without its cubin from us).
  virtual void Publish(const Entry& entry) = 0;

  virtual void FillStats(v1::RemoteTierStats* out) const = 0;

  // Shutting down: waits in ClaimCompile end at once (compile alone), so
  // that a compile thread is not held until a far deadline. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace kcache
