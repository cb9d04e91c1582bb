// Links against the installed kcache client and asks a daemon that is not
// there: proves the headers, the library and its dependencies resolve, and
// that a missing daemon is an error the caller sees (not a crash).
#include <cstdio>

#include "client/client.h"
#include "kernels/attention_params.h"

int main(int argc, char** argv) {
  kcache::ClientOptions opts;
  opts.target = argc > 1 ? argv[1] : "unix:/nonexistent/kcached.sock";
  opts.default_deadline = absl::Milliseconds(300);
  auto client = kcache::Client::Create(opts);
  if (!client.ok()) {
    std::printf("create failed: %s\n", client.status().ToString().c_str());
    return 1;
  }
  kcache::v1::AttentionSpec spec;
  spec.set_dtype(kcache::v1::DTYPE_BF16);
  spec.set_head_dim_qk(128);
  spec.set_num_q_heads(8);
  spec.mutable_mask()->mutable_causal();
  kcache::v1::Target target;
  target.set_arch("sm_90a");
  auto r = (*client)->Fetch(spec, target);
  std::printf("params %zu bytes; fetch without a daemon: %s\n", sizeof(kcache::AttentionParams),
              r.ok() ? "OK" : r.status().ToString().c_str());
  return r.ok() ? 1 : 0;
}
