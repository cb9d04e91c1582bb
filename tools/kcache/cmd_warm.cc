// `kcache warm`: compiles every spec x arch of a manifest through the daemon.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cache/key.h"
#include "tools/kcache/command.h"
#include "tools/kcache/manifest.h"
#include "tools/kcache/output.h"
#include "tools/kcache/warm.h"

namespace kcache::tools {

using nlohmann::json;

int WarmCommand(CommandContext& c) {
  if (!c.conn.store.empty()) {
    return c.Usage(
        "warm compiles through a daemon, not on a store directly; start one first: "
        "kcached --compile_only --store_path=DIR --socket_path=SOCK & then kcache "
        "warm --socket SOCK MANIFEST");
  }
  WarmOptions wo;
  if (c.args.has("jobs")) {
    int jobs = 0;
    if (!absl::SimpleAtoi(c.args.get("jobs"), &jobs) || jobs < 1 || jobs > 64) {
      return c.Usage(absl::StrCat("--jobs: '", c.args.get("jobs"), "' is not a number in 1..64"));
    }
    wo.jobs = jobs;
  }
  if (c.args.has("deadline")) {
    auto d = c.PositiveDurationArg("deadline");
    if (!d) return c.exit_code;
    wo.deadline = *d;
  }
  auto items = LoadManifest(c.args.positional[0]);
  if (!items.ok()) return c.Usage(items.status().message());
  auto admin = c.Open();
  if (!admin) return c.exit_code;
  if (admin->channel() == nullptr) {
    return c.Fail(absl::UnavailableError(
        "warm needs a running daemon and none answers (start kcached --compile_only, or "
        "pass --socket)"));
  }
  Progress bar(c.io.err, c.io.tty && !c.as_json, "warm", items->size());
  size_t compiled = 0, cached = 0, failed = 0;
  wo.on_done = [&](const WarmResult& r, size_t done) {
    const char* what = !r.status.ok() ? "FAILED" : r.hit ? "cached" : "compiled";
    if (!r.status.ok()) {
      ++failed;
    } else if (r.hit) {
      ++cached;
    } else {
      ++compiled;
    }
    std::string label = absl::StrCat(r.item.name, " ", r.item.arch);
    if (bar.tty()) {
      bar.Update(done, absl::StrCat(compiled, " compiled, ", cached, " cached, ", failed,
                                    " failed  ", label));
    } else if (!c.as_json) {
      c.io.err << absl::StrFormat("[%d/%d] %-8s %s (%.1f s)%s\n", done, items->size(), what, label,
                                  absl::ToDoubleSeconds(r.elapsed),
                                  r.status.ok() ? "" : ": " + std::string(r.status.message()));
    }
  };
  // A compile taking longer than a couple of seconds is shown while it runs:
  // on the bar's line on a terminal, else as a line on stderr.
  wo.on_waiting = [&](size_t done, size_t outstanding, const WarmItem& oldest,
                      absl::Duration waited) {
    std::string label = absl::StrCat(oldest.name, " ", oldest.arch);
    if (bar.tty()) {
      bar.Update(done, absl::StrFormat("%d outstanding, waiting %.0f s on %s", outstanding,
                                       absl::ToDoubleSeconds(waited), label));
    } else if (!c.as_json) {
      c.io.err << absl::StrFormat("[%d/%d] waiting  %s (%.0f s so far; %d outstanding)\n", done,
                                  items->size(), label, absl::ToDoubleSeconds(waited), outstanding);
    }
  };
  absl::Time start = absl::Now();
  std::vector<WarmResult> results = tools::Warm(admin->channel(), *items, wo);
  bar.Finish();
  if (c.as_json) {
    json arr = json::array();
    for (const auto& r : results) {
      arr.push_back({{"name", r.item.name},
                     {"arch", r.item.arch},
                     {"result", !r.status.ok() ? "failed"
                                : r.hit        ? "cached"
                                               : "compiled"},
                     {"key", r.status.ok() ? KeyToHex(r.key) : ""},
                     {"error", std::string(r.status.message())},
                     {"seconds", absl::ToDoubleSeconds(r.elapsed)}});
    }
    c.PrintJson({{"total", results.size()},
                 {"compiled", compiled},
                 {"cached", cached},
                 {"failed", failed},
                 {"results", arr}});
  } else {
    c.io.out << absl::StrFormat("warm: %d kernels: %d compiled, %d cached, %d failed (%.1f s)\n",
                                results.size(), compiled, cached, failed,
                                absl::ToDoubleSeconds(absl::Now() - start));
  }
  for (const auto& r : results) {
    if (r.status.ok()) continue;
    c.io.err << "kcache: warm: failed: " << r.item.name << " " << r.item.arch << ": "
             << r.status.message() << "\n";
  }
  if (failed == 0) return kExitOk;
  // The daemon went away mid-way: say so with the "unavailable" status.
  bool all_unavailable = std::all_of(results.begin(), results.end(), [](const WarmResult& r) {
    return r.status.ok() || absl::IsUnavailable(r.status);
  });
  return all_unavailable ? kExitUnavailable : kExitFailed;
}

}  // namespace kcache::tools
