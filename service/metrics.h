// Prometheus metrics for the daemon: counters, gauges and histograms with a
// fixed label set, rendered in the text exposition format. All methods are
// thread-safe; hot-path updates are single atomic operations.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace kcache {

class Counter {
 public:
  void Inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// Cumulative histogram over fixed upper bounds (seconds, for latencies).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum;
    uint64_t count;
  };
  Snapshot Take() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_micros_{0};  // sum in millionths, to stay atomic
};

class MetricsRegistry {
 public:
  // Returns the counter for (name, labels), creating it on first use. The
  // returned pointer lives as long as the registry. `labels` is the
  // rendered label set, e.g. `queue="gpu0"` (empty for none).
  Counter* GetCounter(const std::string& name, const std::string& help,
                      const std::string& labels = "");
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds, const std::string& labels = "");
  // A gauge read at scrape time. The callback runs on the scraping thread
  // with no registry lock held; it must be thread-safe.
  void AddGauge(const std::string& name, const std::string& help,
                std::function<std::vector<std::pair<std::string, double>>()> read);
  // A counter kept elsewhere (a total since start, never decreasing), read
  // at scrape time as AddGauge's are; `name` ends in _total.
  void AddCounterFunc(const std::string& name, const std::string& help,
                      std::function<std::vector<std::pair<std::string, double>>()> read);

  // Text exposition format 0.0.4. Numbers, bucket bounds (`le`) included,
  // in their shortest form that reads back as the same double ("0.1", not
  // "0.10000000000000001").
  std::string Render() const;

 private:
  struct Family {
    std::string help;
    std::string type;
    std::map<std::string, std::unique_ptr<Counter>> counters;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
    std::function<std::vector<std::pair<std::string, double>>()> gauge;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kcache
