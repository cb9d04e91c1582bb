// Parallel GetKernel for `kcache warm` (see warm.h).
#include "tools/kcache/warm.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "kcache/v1/service.grpc.pb.h"

namespace kcache::tools {

std::vector<WarmResult> Warm(const std::shared_ptr<grpc::Channel>& channel,
                             const std::vector<WarmItem>& items, const WarmOptions& options) {
  std::vector<WarmResult> results(items.size());
  auto stub = v1::KernelService::NewStub(channel);
  std::atomic<size_t> next{0};
  absl::Mutex mu;  // serializes on_done and on_waiting; guards the three below
  size_t done = 0;
  std::map<size_t, absl::Time> outstanding;  // item index -> when it was asked for
  bool finished = false;
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < items.size(); i = next.fetch_add(1)) {
      {
        absl::MutexLock lock(&mu);
        outstanding[i] = absl::Now();
      }
      WarmResult& r = results[i];
      r.item = items[i];
      v1::GetKernelRequest req;
      *req.mutable_spec() = items[i].spec;
      req.mutable_target()->set_arch(items[i].arch);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.deadline));
      v1::GetKernelResponse resp;
      absl::Time start = absl::Now();
      r.status = FromGrpcStatus(stub->GetKernel(&ctx, req, &resp));
      r.elapsed = absl::Now() - start;
      if (r.status.ok()) {
        r.hit = resp.cache_hit();
        r.key = resp.record().key();
      }
      absl::MutexLock lock(&mu);
      outstanding.erase(i);
      ++done;
      if (options.on_done) options.on_done(r, done);
    }
  };
  // The waiting reporter: wakes every progress_every (or when all is done).
  std::thread reporter;
  if (options.on_waiting) {
    reporter = std::thread([&] {
      absl::MutexLock lock(&mu);
      while (!mu.AwaitWithTimeout(absl::Condition(&finished), options.progress_every)) {
        if (outstanding.empty()) continue;
        auto oldest =
            std::min_element(outstanding.begin(), outstanding.end(),
                             [](const auto& a, const auto& b) { return a.second < b.second; });
        absl::Duration waited = absl::Now() - oldest->second;
        if (waited < options.progress_after) continue;
        options.on_waiting(done, outstanding.size(), items[oldest->first], waited);
      }
    });
  }
  int jobs = std::clamp<int>(options.jobs, 1, 64);
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min<int>(jobs, static_cast<int>(items.size())); ++t) {
    threads.emplace_back(worker);
  }
  for (auto& t : threads) t.join();
  {
    absl::MutexLock lock(&mu);
    finished = true;
  }
  if (reporter.joinable()) reporter.join();
  return results;
}

}  // namespace kcache::tools
