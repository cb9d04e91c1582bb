// Store benchmarks: lookups served from RocksDB (digest check included, the
// in-memory layer off) and publish latency at 10^4 entries of distinct
// 200 KB cubins; lookups and open time at 10^6 entries with small blobs; the
// in-memory hot hit. Prints p50/p99 per benchmark as counters (us).
//
// Stores are built once (bulk WriteBatches, sync off; not measured) under
// $KCACHE_BENCH_DIR (default /tmp/kcache-bench) and reused by later runs.
// `--smoke` runs a tiny version of everything in a temporary directory.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "cache/store.h"
#include "rocksdb/db.h"
#include "tests/cache/make_cubin.h"

namespace kcache {
namespace {

namespace fs = std::filesystem;
using testing::MakeCubin;

bool g_smoke = false;
std::string g_dir;

size_t Scale(size_t n) { return g_smoke ? std::max<size_t>(n / 1000, 10) : n; }

v1::Toolchain Toolchain() {
  v1::Toolchain t;
  t.set_compiler("nvrtc");
  t.set_version("13.0");
  t.set_build("bench");
  t.add_options("-arch=sm_90a");
  return t;
}

v1::KernelRecord Record(uint64_t n) {
  static const v1::Toolchain t = Toolchain();
  static const std::string digest = ToHex(Sha256("templates"));
  v1::KernelRecord r;
  const std::string spec = absl::StrCat("bench-spec-", n);
  r.set_key(*ComputeKey(KeyParts{spec, digest, &t, "sm_90a"}));
  *r.mutable_toolchain() = t;
  r.set_arch("sm_90a");
  r.set_template_digest(digest);
  r.mutable_spec()->set_head_dim_qk(128);
  r.mutable_spec()->mutable_mask()->mutable_causal();
  auto* ep = r.add_entry_points();
  ep->set_name("attn_fwd");
  ep->set_threads(128);
  return r;
}

StoreOptions BenchOptions(bool hot) {
  StoreOptions o;
  o.hot_cache_bytes = hot ? size_t{256} << 20 : 0;
  o.stats_flush_interval = absl::Seconds(5);
  return o;
}

// Builds (once) a store of `n` entries with `blob` byte cubins.
std::string EnsureStore(const std::string& name, size_t n, size_t blob) {
  const std::string path = absl::StrCat(g_dir, "/", name);
  if (fs::exists(path + "/READY")) return path;
  fs::remove_all(path);
  auto store = Store::Open(path, BenchOptions(false));
  if (!store.ok()) std::abort();
  const size_t per_batch = std::max<size_t>(1, (size_t{32} << 20) / (blob + 512));
  for (size_t i = 0; i < n;) {
    std::vector<PublishItem> batch;
    for (size_t j = 0; j < per_batch && i < n; ++j, ++i) {
      batch.push_back({Record(i), MakeCubin(blob, i)});
    }
    if (!(*store)->PublishBatch(std::move(batch), /*sync=*/false).ok()) std::abort();
  }
  // Settle the LSM tree as an offline warm-up would, so that measurements do
  // not race the compactions the bulk load triggered.
  for (const char* cf : {"records", "blobs", "refs", "stats"}) {
    rocksdb::DB* db = (*store)->raw_db_for_testing();
    if (!db->CompactRange(rocksdb::CompactRangeOptions(), (*store)->column_family_for_testing(cf),
                          nullptr, nullptr)
             .ok()) {
      std::abort();
    }
  }
  if (!(*store)->Close().ok()) std::abort();
  std::ofstream(path + "/READY") << n << " entries\n";
  return path;
}

void Report(benchmark::State& state, std::vector<double>& us) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  state.counters["p50_us"] = us[us.size() / 2];
  state.counters["p99_us"] = us[std::min(us.size() - 1, us.size() * 99 / 100)];
}

template <typename F>
double TimeUs(F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void LookupFromStore(benchmark::State& state, const std::string& name, size_t n, size_t blob) {
  const std::string path = EnsureStore(name, n, blob);
  auto store = Store::Open(path, BenchOptions(/*hot=*/false));
  if (!store.ok()) {
    state.SkipWithError(store.status().ToString().c_str());
    return;
  }
  std::mt19937_64 rng(42);
  std::vector<std::string> keys;
  for (int i = 0; i < 4096; ++i) keys.push_back(Record(rng() % n).key());
  std::vector<double> us;
  size_t i = 0;
  for (auto _ : state) {
    const std::string& key = keys[i++ % keys.size()];
    EntryRef e;
    us.push_back(TimeUs([&] { e = *(*store)->Lookup(key); }));
    if (e == nullptr || e->cubin.size() != blob) state.SkipWithError("lookup missed");
    benchmark::DoNotOptimize(e);
  }
  Report(state, us);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * blob));
}

void BM_StoreHit_10k_200KB(benchmark::State& state) {
  LookupFromStore(state, "s10k_200k", Scale(10'000), 200 * 1024);
}
void BM_StoreHit_10k_256B(benchmark::State& state) {
  LookupFromStore(state, "s10k_256", Scale(10'000), 256);
}
void BM_StoreHit_1M_256B(benchmark::State& state) {
  LookupFromStore(state, "s1m_256", Scale(1'000'000), 256);
}

void BM_Publish_200KB_into_10k(benchmark::State& state) {
  const size_t n = Scale(10'000);
  const std::string path = EnsureStore("s10k_200k", n, 200 * 1024);
  auto store = Store::Open(path, BenchOptions(/*hot=*/false));
  if (!store.ok()) {
    state.SkipWithError(store.status().ToString().c_str());
    return;
  }
  std::vector<double> us;
  uint64_t i = 0;
  for (auto _ : state) {
    state.PauseTiming();
    v1::KernelRecord r = Record(n + i);  // beyond the bulk-loaded keys
    std::string cubin = MakeCubin(200 * 1024, 1'000'000'000 + i);
    ++i;
    state.ResumeTiming();
    us.push_back(TimeUs([&] {
      if (!(*store)->Publish(std::move(r), std::move(cubin)).ok()) std::abort();
    }));
  }
  Report(state, us);
}

void BM_HotHit_200KB(benchmark::State& state) {
  const size_t n = Scale(10'000);
  const std::string path = EnsureStore("s10k_200k", n, 200 * 1024);
  auto store = Store::Open(path, BenchOptions(/*hot=*/true));
  if (!store.ok()) {
    state.SkipWithError(store.status().ToString().c_str());
    return;
  }
  std::vector<std::string> keys;
  for (size_t i = 0; i < 64 && i < n; ++i) {
    keys.push_back(Record(i).key());
    (void)(*store)->Lookup(keys.back());  // warm the in-memory layer
  }
  std::vector<double> us;
  size_t i = 0;
  for (auto _ : state) {
    const std::string& key = keys[i++ % keys.size()];
    EntryRef e;
    us.push_back(TimeUs([&] { e = *(*store)->Lookup(key); }));
    benchmark::DoNotOptimize(e);
  }
  Report(state, us);
}

void BM_Open_1M(benchmark::State& state) {
  const std::string path = EnsureStore("s1m_256", Scale(1'000'000), 256);
  std::vector<double> us;
  for (auto _ : state) {
    std::unique_ptr<Store> s;
    us.push_back(TimeUs([&] {
      auto o = Store::Open(path, BenchOptions(false));
      if (!o.ok()) std::abort();
      s = *std::move(o);
    }));
    state.PauseTiming();
    (void)s->Close();
    s.reset();
    state.ResumeTiming();
  }
  Report(state, us);
}

}  // namespace
}  // namespace kcache

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--smoke") {
      kcache::g_smoke = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  namespace fs = std::filesystem;
  std::string smoke_dir;
  if (kcache::g_smoke) {
    smoke_dir =
        (fs::temp_directory_path() / absl::StrCat("kcache-bench-smoke-", getpid())).string();
    kcache::g_dir = smoke_dir;
  } else {
    const char* d = std::getenv("KCACHE_BENCH_DIR");
    kcache::g_dir = d != nullptr ? d : "/tmp/kcache-bench";
  }
  fs::create_directories(kcache::g_dir);
  const int reps = kcache::g_smoke ? 20 : 0;
  auto reg = [&](const char* name, void (*fn)(benchmark::State&), int iters) {
    auto* b = benchmark::RegisterBenchmark(name, fn)->Unit(benchmark::kMicrosecond);
    b->Iterations(kcache::g_smoke ? reps : iters);
  };
  reg("BM_StoreHit_10k_200KB", kcache::BM_StoreHit_10k_200KB, 20000);
  reg("BM_Publish_200KB_into_10k", kcache::BM_Publish_200KB_into_10k, 300);
  reg("BM_HotHit_200KB", kcache::BM_HotHit_200KB, 200000);
  reg("BM_StoreHit_10k_256B", kcache::BM_StoreHit_10k_256B, 50000);
  reg("BM_StoreHit_1M_256B", kcache::BM_StoreHit_1M_256B, 50000);
  reg("BM_Open_1M", kcache::BM_Open_1M, 5);
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (!smoke_dir.empty()) fs::remove_all(smoke_dir);
  return 0;
}
