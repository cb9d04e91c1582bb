#include "service/metrics.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kcache {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_micros_.fetch_add(static_cast<uint64_t>(std::llround(std::max(v, 0.0) * 1e6)),
                        std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t acc = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    acc += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(acc);
  }
  s.count = acc;
  s.sum = static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6;
  return s;
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const std::string& labels) {
  absl::MutexLock lock(&mu_);
  Family& f = families_[name];
  f.help = help;
  f.type = "counter";
  auto& c = f.counters[labels];
  if (!c) c = std::make_unique<Counter>();
  return c.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         std::vector<double> bounds, const std::string& labels) {
  absl::MutexLock lock(&mu_);
  Family& f = families_[name];
  f.help = help;
  f.type = "histogram";
  auto& h = f.histograms[labels];
  if (!h) h = std::make_unique<Histogram>(std::move(bounds));
  return h.get();
}

void MetricsRegistry::AddGauge(const std::string& name, const std::string& help,
                               std::function<std::vector<std::pair<std::string, double>>()> read) {
  absl::MutexLock lock(&mu_);
  Family& f = families_[name];
  f.help = help;
  f.type = "gauge";
  f.gauge = std::move(read);
}

void MetricsRegistry::AddCounterFunc(
    const std::string& name, const std::string& help,
    std::function<std::vector<std::pair<std::string, double>>()> read) {
  absl::MutexLock lock(&mu_);
  Family& f = families_[name];
  f.help = help;
  f.type = "counter";
  f.gauge = std::move(read);
}

namespace {
std::string WithLabels(const std::string& name, const std::string& labels,
                       const std::string& extra = "") {
  std::string all = labels;
  if (!extra.empty()) all = all.empty() ? extra : absl::StrCat(all, ",", extra);
  return all.empty() ? name : absl::StrCat(name, "{", all, "}");
}
// The shortest decimal that reads back as `v`: "0.1", "2.5", "600", "1e-05".
std::string Num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);  // not 6e+02
  for (int precision = 1; precision < 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}
}  // namespace

std::string MetricsRegistry::Render() const {
  // Copy what is needed under the lock; gauge callbacks run without it.
  struct Item {
    std::string name, help, type;
    std::vector<std::pair<std::string, uint64_t>> counters;
    std::vector<std::pair<std::string, Histogram::Snapshot>> histograms;
    std::function<std::vector<std::pair<std::string, double>>()> gauge;
  };
  std::vector<Item> items;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, f] : families_) {
      Item it{name, f.help, f.type, {}, {}, f.gauge};
      for (const auto& [l, c] : f.counters) it.counters.emplace_back(l, c->Value());
      for (const auto& [l, h] : f.histograms) it.histograms.emplace_back(l, h->Take());
      items.push_back(std::move(it));
    }
  }
  std::string out;
  for (const Item& it : items) {
    absl::StrAppend(&out, "# HELP ", it.name, " ", it.help, "\n# TYPE ", it.name, " ", it.type,
                    "\n");
    for (const auto& [l, v] : it.counters)
      absl::StrAppend(&out, WithLabels(it.name, l), " ", v, "\n");
    for (const auto& [l, s] : it.histograms) {
      for (size_t i = 0; i < s.cumulative.size(); ++i) {
        std::string le = i < s.bounds.size() ? Num(s.bounds[i]) : "+Inf";
        absl::StrAppend(&out, WithLabels(it.name + "_bucket", l, absl::StrCat("le=\"", le, "\"")),
                        " ", s.cumulative[i], "\n");
      }
      absl::StrAppend(&out, WithLabels(it.name + "_sum", l), " ", Num(s.sum), "\n");
      absl::StrAppend(&out, WithLabels(it.name + "_count", l), " ", s.count, "\n");
    }
    if (it.gauge) {
      for (const auto& [l, v] : it.gauge())
        absl::StrAppend(&out, WithLabels(it.name, l), " ", Num(v), "\n");
    }
  }
  return out;
}

}  // namespace kcache
