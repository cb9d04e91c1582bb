// Helpers for the store tests: a fresh temporary directory per test, the
// status matchers (tests/common/status_matchers.h), and records/cubins
// built the way the compiler will build them (MakeCubin lives in
// make_cubin.h, which the benchmarks share).
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cache/digest.h"
#include "cache/key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kcache/v1/record.pb.h"
#include "tests/cache/make_cubin.h"
#include "tests/common/status_matchers.h"

namespace kcache::testing {

// A fresh directory under $TMPDIR, removed with everything in it at scope end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kcache-test-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline v1::Toolchain MakeToolchain(const std::string& version = "13.0") {
  v1::Toolchain t;
  t.set_compiler("nvrtc");
  t.set_version(version);
  t.set_build("cuda_13.0.r13.0/compiler.36260728_0");
  t.add_options("-arch=sm_90a");
  t.add_options("-std=c++17");
  return t;
}

// A record for kernel number `n` of `toolchain`; the spec bytes stand in for
// the compiler's canonical spec bytes.
inline v1::KernelRecord MakeRecord(uint64_t n, const v1::Toolchain& toolchain = MakeToolchain(),
                                   const std::string& arch = "sm_90a", int64_t created_ms = 0) {
  v1::KernelRecord r;
  const std::string spec = absl::StrCat("spec-", n);
  const std::string tdigest = ToHex(Sha256("templates-v1"));
  KeyParts parts{spec, tdigest, &toolchain, arch};
  r.set_key(*ComputeKey(parts));
  *r.mutable_toolchain() = toolchain;
  r.set_arch(arch);
  r.mutable_spec()->set_head_dim_qk(128);
  r.mutable_spec()->set_num_q_heads(static_cast<uint32_t>(n % 64 + 1));
  if (n % 2 == 0) r.mutable_spec()->mutable_mask()->mutable_causal();
  r.set_template_digest(tdigest);
  r.set_created_unix_ms(created_ms);
  auto* ep = r.add_entry_points();
  ep->set_name("attn_fwd");
  ep->set_role(v1::ENTRY_ROLE_FORWARD);
  ep->set_threads(128);
  return r;
}

}  // namespace kcache::testing
