// Tests of the kcache CLI in process (tools/kcache/): argument parsing and
// value parsers, the manifest, and every command directly on a real store in
// a fresh temporary directory (records made as the compiler makes them).
#include "tools/kcache/cli.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cache/key.h"
#include "cache/store.h"
#include "compiler/cuda/nvrtc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/metadata.h"
#include "tests/cache/test_util.h"
#include "tools/kcache/args.h"
#include "tools/kcache/manifest.h"

namespace kcache::tools {
namespace {

using ::kcache::testing::MakeCubin;
using ::kcache::testing::MakeRecord;
using ::kcache::testing::MakeToolchain;
using ::kcache::testing::StatusIs;
using ::kcache::testing::TempDir;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

struct CliRun {
  int code;
  std::string out, err;
};

CliRun Kcache(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  int code = RunKcache(args, {out, err, false});
  return {code, out.str(), err.str()};
}

std::string Show(const CliRun& r) {
  return absl::StrCat("exit ", r.code, "\nstdout:\n", r.out, "\nstderr:\n", r.err);
}

// --- args -------------------------------------------------------------------

TEST(Args, ParsesFlagsBothWaysAndRefusesWhatItDoesNotKnow) {
  std::vector<FlagSpec> known = {{"out", true, "FILE", ""}, {"json", false, "", ""}};
  auto a = ParseArgs({"--out", "f", "x", "--json"}, known);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->get("out"), "f");
  EXPECT_TRUE(a->has("json"));
  EXPECT_EQ(a->positional, std::vector<std::string>{"x"});
  EXPECT_EQ(ParseArgs({"--out=g"}, known)->get("out"), "g");
  EXPECT_THAT(ParseArgs({"--nope"}, known), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseArgs({"--out"}, known), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseArgs({"--json=1"}, known), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseArgs({"--out=a", "--out=b"}, known),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(ParseArgs({"--", "--json"}, known)->positional, std::vector<std::string>{"--json"});
}

TEST(Args, TimesSizesAndDurations) {
  absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  EXPECT_EQ(*ParseWhen("30d", now), now - absl::Hours(24 * 30));
  EXPECT_EQ(*ParseWhen("12h", now), now - absl::Hours(12));
  EXPECT_EQ(*ParseWhen("@1764504000000", now), absl::FromUnixMillis(1764504000000));
  EXPECT_EQ(*ParseWhen("2026-11-30", now),
            absl::FromCivil(absl::CivilDay(2026, 11, 30), absl::UTCTimeZone()));
  EXPECT_EQ(*ParseWhen("2026-11-30T12:00:00Z", now),
            absl::FromCivil(absl::CivilSecond(2026, 11, 30, 12, 0, 0), absl::UTCTimeZone()));
  EXPECT_THAT(ParseWhen("yesterday", now), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseWhen("@x", now), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(*ParseBytes("1048576"), 1048576u);
  EXPECT_EQ(*ParseBytes("512M"), 512u << 20);
  EXPECT_EQ(*ParseBytes("10GiB"), uint64_t{10} << 30);
  EXPECT_EQ(*ParseBytes("0"), 0u);
  EXPECT_THAT(ParseBytes("lots"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseBytes("-1"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseBytes("99999999999T"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(*ParseDurationArg("90"), absl::Seconds(90));
  EXPECT_EQ(*ParseDurationArg("10m"), absl::Minutes(10));
  EXPECT_THAT(ParseDurationArg("soon"), StatusIs(absl::StatusCode::kInvalidArgument));
}

// --- manifest -----------------------------------------------------------------

TEST(Manifest, TheSampleManifestParses) {
  auto items = LoadManifest(KCACHE_SOURCE_DIR "/docker/warm-manifest.yaml");
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), 6u);
  EXPECT_EQ((*items)[0].name, "causal-bf16-d128-gqa");
  EXPECT_EQ((*items)[0].arch, "sm_80");
  EXPECT_EQ((*items)[1].arch, "sm_90a");
  EXPECT_EQ((*items)[0].spec.dtype(), v1::DTYPE_BF16);
  EXPECT_EQ((*items)[0].spec.num_kv_heads(), 8u);
  EXPECT_TRUE((*items)[0].spec.mask().has_causal());
  EXPECT_TRUE((*items)[4].spec.mask().has_drafter());
  EXPECT_EQ((*items)[4].spec.mask().drafter().block_size(), 16u);
  EXPECT_TRUE((*items)[5].spec.return_lse());
}

TEST(Manifest, JsonWorksTooAndNamesDefaultToTheDescription) {
  auto items = ParseManifest(
      R"({"archs": ["sm_90a"], "specs": [{"spec": {"dtype": "DTYPE_FP16", "headDimQk": 64,
          "numQHeads": 4, "softmaxScale": 0.125}}]})");
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), 1u);
  EXPECT_EQ((*items)[0].arch, "sm_90a");
  EXPECT_FLOAT_EQ((*items)[0].spec.softmax_scale(), 0.125f);
  EXPECT_THAT((*items)[0].name, HasSubstr("fp16 d64"));
}

TEST(Manifest, ErrorsNameTheEntryAndTheReason) {
  struct Case {
    std::string text, expected;
  };
  std::vector<Case> cases = {
      {"specs: [", "manifest"},
      {"archs: [sm_80]\nspecs: []\n", "'specs' must be a non-empty list"},
      {"archs: [sm_80]\nextra: 1\nspecs: [{spec: {}}]\n", "unknown key 'extra'"},
      {"specs: [{spec: {dtype: DTYPE_BF16}}]\n", "specs[0]: no archs"},
      {"archs: [80]\nspecs: [{spec: {}}]\n", "archs[0]: not an architecture"},
      {"archs: [sm_80]\nspecs: [{name: a, spec: {head_dim: 64}}]\n", "specs[0] (a): spec JSON"},
      {"archs: [sm_80]\nspecs: [{name: a, spec: {}}, {name: a, spec: {}}]\n",
       "specs[1] (a): the name 'a' is used twice"},
      {"archs: [sm_80]\nspecs: [{name: a, spek: {}}]\n", "unknown key 'spek'"},
      {"archs: [sm_80]\nspecs: [{name: a}]\n", "'spec' (a mapping) is missing"},
  };
  for (const auto& c : cases) {
    auto r = ParseManifest(c.text);
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument)) << c.text;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.expected)) << c.text;
  }
}

// --- commands on a store ------------------------------------------------------

v1::Toolchain OtherToolchain() { return MakeToolchain("12.8"); }

// A store with 4 entries of MakeToolchain() (sm_90a; two sm_80) and 2 of
// OtherToolchain(); created at times 1000..6000 ms; sizes grow with n.
class StoreCli : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions o;
    o.stats_flush_interval = absl::ZeroDuration();
    auto s = Store::Open(store_dir(), o);
    ASSERT_TRUE(s.ok()) << s.status();
    for (uint64_t n = 0; n < 6; ++n) {
      v1::Toolchain tc = n < 4 ? MakeToolchain() : OtherToolchain();
      auto rec = MakeRecord(n, tc, n == 1 || n == 2 ? "sm_80" : "sm_90a",
                            static_cast<int64_t>(1000 * (n + 1)));
      rec.mutable_toolchain()->set_id(ToolchainIdHex(tc));
      keys_.push_back(rec.key());
      ASSERT_TRUE((*s)->Publish(rec, MakeCubin(1000 * (n + 1), n)).ok());
    }
    ASSERT_TRUE((*s)->Close().ok());
  }

  std::string store_dir() const { return dir_.Sub("store"); }
  std::string hex(int n) const { return KeyToHex(keys_[static_cast<size_t>(n)]); }
  CliRun Do(std::vector<std::string> args) {
    args.insert(args.begin(), {"--store", store_dir()});
    return Kcache(args);
  }
  std::vector<std::string> ListedKeys(std::vector<std::string> args) {
    args.insert(args.begin(), {std::string("--json"), std::string("ls")});
    CliRun r = Do(args);
    EXPECT_EQ(r.code, 0) << Show(r);
    std::vector<std::string> out;
    const json listed = json::parse(r.out);
    for (const auto& e : listed["entries"]) {
      out.push_back(e["record"]["key"].get<std::string>());
    }
    return out;
  }

  TempDir dir_;
  std::vector<std::string> keys_;
};

TEST_F(StoreCli, LsFiltersSortsAndLimits) {
  EXPECT_EQ(ListedKeys({}).size(), 6u);
  const std::string tc = ToolchainIdHex(MakeToolchain());
  EXPECT_EQ(ListedKeys({"--toolchain", tc}).size(), 4u);
  auto sm80 = ListedKeys({"--arch", "sm_80"});
  EXPECT_THAT(sm80, ::testing::UnorderedElementsAre(hex(1), hex(2)));
  EXPECT_THAT(ListedKeys({"--mask", "causal"}),
              ::testing::UnorderedElementsAre(hex(0), hex(2), hex(4)));
  EXPECT_THAT(ListedKeys({"--created-before", "@2500"}),
              ::testing::UnorderedElementsAre(hex(0), hex(1)));
  EXPECT_EQ(ListedKeys({"--sort", "size"}),
            (std::vector<std::string>{hex(5), hex(4), hex(3), hex(2), hex(1), hex(0)}));
  EXPECT_EQ(ListedKeys({"--sort=created", "--limit=2"}),
            (std::vector<std::string>{hex(5), hex(4)}));
  EXPECT_THAT(ListedKeys({"--pinned"}), IsEmpty());
  EXPECT_EQ(ListedKeys({"--unused-since", "1d"}).size(), 6u);  // never used

  CliRun table = Do({"ls", "--arch", "sm_80"});
  ASSERT_EQ(table.code, 0) << Show(table);
  EXPECT_THAT(table.out, HasSubstr("KEY"));
  EXPECT_THAT(table.out, HasSubstr(hex(1).substr(0, 28)));
  EXPECT_THAT(table.out, Not(HasSubstr(hex(0).substr(0, 28))));
}

TEST_F(StoreCli, ShowTakesAUniquePrefix) {
  CliRun r = Do({"show", hex(3).substr(0, 30)});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr(hex(3)));
  EXPECT_THAT(r.out, HasSubstr("attn_fwd"));
  EXPECT_THAT(r.out, HasSubstr("ENTRY_ROLE_FORWARD"));
  EXPECT_THAT(r.out, HasSubstr("verified      no"));
  EXPECT_THAT(r.out, HasSubstr("spec (JSON):"));
  CliRun j = Do({"--json", "show", hex(3)});
  ASSERT_EQ(j.code, 0) << Show(j);
  json e = json::parse(j.out);
  EXPECT_EQ(e["record"]["key"], hex(3));
  EXPECT_EQ(e["record"]["cubin_size"], 4000);
  // The toolchain prefix alone matches several entries.
  CliRun amb = Do({"show", hex(0).substr(0, 18)});
  EXPECT_EQ(amb.code, 1) << Show(amb);
  EXPECT_THAT(amb.err, HasSubstr("ambiguous"));
  CliRun none = Do({"show", "02"});
  EXPECT_EQ(none.code, 1) << Show(none);
}

#ifdef KCACHE_TEST_WITH_LLVM
// `kcache show` reads the cubin's own kernels from its ELF. A cubin of two
// images (an attention module with backward) whose images both define a
// device function lists it once per image, and an IMAGE column says which;
// a cubin of one image has no such column.
TEST(ShowCli, SaysWhichImageEachKernelOfASeveralImageCubinIsIn) {
  const std::string shared =
      "__device__ __noinline__ float kc_twice(float x) { return x * x + 1.0f; }\n";
  const auto kernel = [&](const std::string& name) {
    return shared + "extern \"C\" __global__ void " + name +
           "(float* x) { x[threadIdx.x] = kc_twice(x[threadIdx.x]); }\n";
  };
  CompileInput in;
  in.arch = "sm_90a";
  in.source = kernel("kc_fwd");
  in.more_units = {kernel("kc_bwd")};
  Nvrtc nvrtc;
  absl::StatusOr<CompileOutput> two = CompileUnits(nvrtc, in, absl::InfiniteFuture());
  ASSERT_TRUE(two.ok()) << two.status();
  in.more_units.clear();
  absl::StatusOr<CompileOutput> one = CompileUnits(nvrtc, in, absl::InfiniteFuture());
  ASSERT_TRUE(one.ok()) << one.status();

  TempDir dir;
  const std::string store = dir.Sub("store");
  v1::KernelRecord rec_two = MakeRecord(1), rec_one = MakeRecord(2);
  {
    auto s = Store::Open(store, StoreOptions{});
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->Publish(rec_two, two->cubin).ok());
    ASSERT_TRUE((*s)->Publish(rec_one, one->cubin).ok());
    ASSERT_TRUE((*s)->Close().ok());
  }
  CliRun r = Kcache({"--store", store, "show", KeyToHex(rec_two.key())});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr("cubin kernels (from the ELF, sm_90a, 2 images)"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("NAME +IMAGE +KIND"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("kc_fwd +0 +kernel "));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("kc_bwd +1 +kernel "));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("kc_twice[^ ]* +0 +device fn "));
  EXPECT_THAT(r.out, ::testing::ContainsRegex("kc_twice[^ ]* +1 +device fn "));
  CliRun j = Kcache({"--store", store, "--json", "show", KeyToHex(rec_two.key())});
  ASSERT_EQ(j.code, 0) << Show(j);
  const json shown = json::parse(j.out);
  std::vector<std::pair<std::string, int>> listed;
  for (const auto& k : shown["cubin_kernels"]) {
    listed.emplace_back(k["name"].get<std::string>(), k["image"].get<int>());
  }
  EXPECT_THAT(listed, ::testing::IsSupersetOf({std::pair<std::string, int>{"kc_fwd", 0},
                                               std::pair<std::string, int>{"kc_bwd", 1}}));

  CliRun single = Kcache({"--store", store, "show", KeyToHex(rec_one.key())});
  ASSERT_EQ(single.code, 0) << Show(single);
  EXPECT_THAT(single.out, HasSubstr("cubin kernels (from the ELF, sm_90a):"));
  EXPECT_THAT(single.out, Not(HasSubstr("IMAGE")));
  EXPECT_THAT(single.out, ::testing::ContainsRegex("kc_fwd +kernel "));
}
#endif

TEST_F(StoreCli, StatusShowsEntriesPerToolchain) {
  CliRun r = Do({"--json", "status"});
  ASSERT_EQ(r.code, 0) << Show(r);
  json j = json::parse(r.out);
  EXPECT_EQ(j["mode"], "store");
  EXPECT_EQ(j["entries"], 6);
  std::map<std::string, int> per;
  for (const auto& t : j["toolchains"]) per[t["toolchain_id"]] = t["entries"];
  EXPECT_EQ(per, (std::map<std::string, int>{{ToolchainIdHex(MakeToolchain()), 4},
                                             {ToolchainIdHex(OtherToolchain()), 2}}));
  CliRun human = Do({"status"});
  ASSERT_EQ(human.code, 0) << Show(human);
  EXPECT_THAT(human.out, HasSubstr("6 entries"));
  EXPECT_THAT(human.out, HasSubstr(ToolchainIdHex(OtherToolchain())));
  CliRun stats = Do({"stats"});
  ASSERT_EQ(stats.code, 0) << Show(stats);
  EXPECT_THAT(stats.out, HasSubstr("sm_80"));
}

TEST_F(StoreCli, PinUnpinInvalidateAndGc) {
  CliRun r = Do({"pin", hex(0), "--reason", "hot"});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_EQ(ListedKeys({"--pinned"}), std::vector<std::string>{hex(0)});
  EXPECT_EQ(ListedKeys({"--unpinned"}).size(), 5u);
  r = Do({"unpin", hex(0)});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(ListedKeys({"--pinned"}), IsEmpty());

  r = Do({"invalidate", "--toolchain", ToolchainIdHex(OtherToolchain())});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr("removed 2 entries"));
  r = Do({"invalidate", hex(1)});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr("removed 1 entries"));
  r = Do({"invalidate", "--before", "@3500"});  // entries 0 (1000) and 2 (3000)
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr("removed 2 entries"));
  EXPECT_EQ(ListedKeys({}), std::vector<std::string>{hex(3)});

  ASSERT_EQ(Do({"pin", hex(3)}).code, 0);
  r = Do({"gc", "--max-bytes", "0", "--grace", "0"});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr("evicted 0 entries"));  // pinned
  ASSERT_EQ(Do({"unpin", hex(3)}).code, 0);
  r = Do({"gc", "--max-bytes=0", "--grace=0"});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr("evicted 1 entries"));
  EXPECT_THAT(ListedKeys({}), IsEmpty());
}

TEST_F(StoreCli, VerifyQuarantinesAndReportsCorruptEntries) {
  CliRun ok = Do({"verify"});
  ASSERT_EQ(ok.code, 0) << Show(ok);
  EXPECT_THAT(ok.out, HasSubstr("checked 6 entries, 0 corrupt"));
  {
    // Damage entry 2's blob behind the store's back.
    auto s = Store::Open(store_dir(), StoreOptions{});
    ASSERT_TRUE(s.ok());
    auto e = (*s)->Inspect(keys_[2]);
    ASSERT_TRUE(e.ok() && e->has_value());
    ASSERT_TRUE((*s)->raw_db_for_testing()
                    ->Put(rocksdb::WriteOptions(), (*s)->column_family_for_testing("blobs"),
                          (*e)->record().cubin_sha256(), "garbage")
                    .ok());
    ASSERT_TRUE((*s)->Close().ok());
  }
  CliRun bad = Do({"verify"});
  EXPECT_EQ(bad.code, 1) << Show(bad);
  EXPECT_THAT(bad.out, HasSubstr("1 corrupt"));
  EXPECT_THAT(bad.out, HasSubstr("quarantined " + hex(2)));
  EXPECT_EQ(ListedKeys({}).size(), 5u);
}

TEST_F(StoreCli, ExportImportRoundTripAndForeignToolchainsAreRefused) {
  const std::string mine = ToolchainIdHex(MakeToolchain());
  const std::string bundle = dir_.Sub("mine.kcb");
  CliRun r = Do({"export", "--out", bundle, "--toolchain", mine});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr("exported 4 entries"));
  const std::string all = dir_.Sub("all.kcb");
  ASSERT_EQ(Do({"export", "--out", all}).code, 0);

  const std::string fresh = dir_.Sub("fresh");
  r = Kcache({"--store", fresh, "import", "--toolchain", mine, bundle});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr("imported 4 entries, 0 already present"));
  r = Kcache({"--store", fresh, "import", "--toolchain", mine, bundle});
  EXPECT_THAT(r.out, HasSubstr("imported 0 entries, 4 already present"));

  // The whole-store bundle holds another toolchain: refused, nothing written.
  r = Kcache({"--store", fresh, "import", "--toolchain", mine, all});
  EXPECT_EQ(r.code, 1) << Show(r);
  EXPECT_THAT(r.err, HasSubstr("--allow-foreign-toolchain"));
  CliRun st = Kcache({"--store", fresh, "--json", "status"});
  EXPECT_EQ(json::parse(st.out)["entries"], 4);
  r = Kcache({"--store", fresh, "import", "--allow-foreign-toolchain", all});
  ASSERT_EQ(r.code, 0) << Show(r);
  EXPECT_THAT(r.out, HasSubstr("imported 2 entries, 4 already present"));

  // A damaged bundle is refused before anything is opened.
  std::string bytes;
  {
    std::ifstream in(bundle, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  bytes[bytes.size() / 2] ^= 0x55;
  std::ofstream(dir_.Sub("bad.kcb"), std::ios::binary) << bytes;
  const std::string other = dir_.Sub("other");
  r = Kcache({"--store", other, "import", "--toolchain", mine, dir_.Sub("bad.kcb")});
  EXPECT_EQ(r.code, 1) << Show(r);
  EXPECT_FALSE(std::filesystem::exists(other));
}

TEST_F(StoreCli, ALockedStoreIsReadOnlyForTheTool) {
  auto held = Store::Open(store_dir(), StoreOptions{});  // as a daemon would
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(ListedKeys({}).size(), 6u);
  CliRun r = Do({"pin", hex(0)});
  EXPECT_EQ(r.code, 3) << Show(r);
  EXPECT_THAT(r.err, HasSubstr("held by a running daemon"));
  r = Do({"verify"});
  EXPECT_EQ(r.code, 3) << Show(r);
  ASSERT_TRUE((*held)->Close().ok());
  EXPECT_THAT(ListedKeys({"--pinned"}), IsEmpty());
}

TEST_F(StoreCli, BadArgumentsExitTwoAndChangeNothing) {
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"frobnicate"},
      {"ls", "extra"},
      {"ls", "--sort", "color"},
      {"ls", "--mask", "diagonal"},
      {"ls", "--toolchain", "xyz"},
      {"ls", "--limit", "many"},
      {"ls", "--pinned", "--unpinned"},
      {"ls", "--created-before", "yesterday"},
      {"show"},
      {"show", "not-hex"},
      {"pin", "zz"},
      {"pin", hex(0), "--reason"},
      {"unpin"},
      {"invalidate"},
      {"invalidate", "--arch", "sm_80", "--toolchain", ToolchainIdHex(MakeToolchain())},
      {"invalidate", "--toolchain", "old"},
      {"invalidate", "--before", "soon"},
      {"invalidate", "--arch", "sm_80", hex(0)},
      {"gc"},
      {"gc", "--max-bytes", "lots"},
      {"gc", "--max-bytes", "1G", "--grace", "forever"},
      {"export"},
      {"import"},
      {"import", dir_.Sub("missing.kcb")},
      {"warm", KCACHE_SOURCE_DIR "/docker/warm-manifest.yaml"},  // --store: needs a daemon
      {"verify", "--all"},
      {"--timeout", "0", "status"},
  };
  for (const auto& args : bad) {
    CliRun r = Do(args);
    EXPECT_EQ(r.code, 2) << absl::StrJoin(args, " ") << "\n" << Show(r);
    EXPECT_THAT(r.out, IsEmpty()) << absl::StrJoin(args, " ");
    // One line, saying where to look.
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("--help")) << r.err;
  }
  CliRun two = Kcache({"--store", store_dir(), "--socket", "x.sock", "status"});
  EXPECT_EQ(two.code, 2) << Show(two);
  EXPECT_EQ(ListedKeys({}).size(), 6u);
  EXPECT_THAT(ListedKeys({"--pinned"}), IsEmpty());
}

TEST(Cli, HelpForEveryCommandAndUnavailableStores) {
  CliRun h = Kcache({"--help"});
  EXPECT_EQ(h.code, 0);
  EXPECT_THAT(h.out, HasSubstr("exit status"));
  for (const char* cmd : {"status", "stats", "ls", "show", "warm", "export", "import", "invalidate",
                          "gc", "pin", "unpin", "verify", "repair"}) {
    CliRun r = Kcache({cmd, "--help"});
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("usage: kcache ", cmd))) << cmd;
    EXPECT_EQ(Kcache({"help", cmd}).out, r.out);
  }
  TempDir dir;
  const std::string missing = dir.Sub("no-store");
  for (const char* cmd : {"status", "ls", "verify"}) {
    CliRun r = Kcache({"--store", missing, cmd});
    EXPECT_EQ(r.code, 3) << Show(r);
    EXPECT_THAT(r.err, HasSubstr("no kcache store"));
  }
  EXPECT_FALSE(std::filesystem::exists(missing));
  CliRun r = Kcache({"--socket", dir.Sub("none.sock"), "--timeout", "1s", "status"});
  EXPECT_EQ(r.code, 3) << Show(r);
  EXPECT_THAT(r.err, HasSubstr("no kcache daemon"));
}

// `kcache --version` prints the VERSION file's version (through CMake's
// project()), before and after a command, and nothing else.
TEST(Cli, VersionIsTheVersionFile) {
  std::ifstream in(std::string(KCACHE_SOURCE_DIR) + "/VERSION");
  std::string version;
  ASSERT_TRUE(std::getline(in, version));
  ASSERT_THAT(version, ::testing::MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+"));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--version"}, {"ls", "--version"}, {"--json", "--version"}}) {
    CliRun r = Kcache(args);
    EXPECT_EQ(r.code, 0) << Show(r);
    EXPECT_EQ(r.out, "kcache " + version + "\n");
    EXPECT_THAT(r.err, IsEmpty());
  }
  EXPECT_THAT(Kcache({"--help"}).out, HasSubstr("--version"));
}

// A missing socket or a path that is not one: exit 3 at once, naming the path
// (client/discovery.h), with the default 10-minute call timeout.
TEST(Cli, MissingOrWrongSocketExitsThreeAtOnce) {
  for (const char* path : {"/nonexistent", "/nonexistent/kcached.sock"}) {
    const absl::Time t0 = absl::Now();
    CliRun r = Kcache({"--socket", path, "status"});
    EXPECT_LT(absl::Now() - t0, absl::Seconds(1)) << path;
    EXPECT_EQ(r.code, 3) << Show(r);
    EXPECT_THAT(r.err, HasSubstr(path));
    EXPECT_THAT(r.err, HasSubstr("does not exist"));
    EXPECT_THAT(r.err, HasSubstr("scripts/run.sh"));
  }
  TempDir dir;
  const std::string file = dir.Sub("kcached.sock");
  std::ofstream(file) << "x";
  const absl::Time t0 = absl::Now();
  CliRun r = Kcache({"--target", "unix:" + file, "status"});
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  EXPECT_EQ(r.code, 3) << Show(r);
  EXPECT_THAT(r.err, HasSubstr(file + " exists but is not a socket"));
}

// --- hostile input (issue 17.9) and damaged stores (17.2, 17.3) ------------------

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// An alias bomb: each level names the one before ten times (10^9 values).
std::string AliasBomb() {
  std::string spec = "{l0: &l0 [1,1,1,1,1,1,1,1,1,1]";
  for (int i = 1; i < 10; ++i) {
    spec += absl::StrCat(", l", i, ": &l", i, " [");
    for (int j = 0; j < 10; ++j) spec += absl::StrCat(j ? "," : "", "*l", i - 1);
    spec += "]";
  }
  return "archs: [sm_80]\nspecs: [{name: bomb, spec: " + spec + "}}]\n";
}

// These used to abort `kcache warm` (an uncaught yaml-cpp or nlohmann::json
// exception) or run it out of memory.
TEST(Manifest, HostileManifestsAreRefusedWithTheReasonNeverACrash) {
  struct Case {
    std::string text, expected;
  };
  std::vector<Case> cases = {
      {"archs: [sm_80]\nspecs: [{name: {a: 1}, spec: {}}]\n", "specs[0].name: expected a plain"},
      {"archs: [sm_80]\nspecs: [{name: [a, b], spec: {}}]\n", "specs[0].name: expected a plain"},
      {"? [a, b]\n: 1\nspecs: [{spec: {}}]\n", "a top-level key"},
      {"archs: [sm_80]\nspecs: [{? {x: 1} : 2, spec: {}}]\n", "specs[0]: a key"},
      {"archs: [sm_80]\nspecs: [{name: a, spec: {? [x] : 1}}]\n", "specs[0] (a).spec: a key"},
      {"archs: [sm_80]\nspecs: [{name: \"\xff\xfe\", spec: {}}]\n", ""},
      {"archs: [sm_80]\nspecs: [{name: a, spec: {dtype: \"\xc3\x28\"}}]\n", ""},
      {"archs: [sm_80]\nspecs: [{name: a, spec: {\"\xe2\x82\": 1}}]\n", ""},
      {"archs: [\"sm_8\xff\"]\nspecs: [{name: a, spec: {}}]\n", "archs[0]"},
      {AliasBomb(), "too large"},
      {"archs: [sm_80]\nspecs: [{name: a, spec: " + Repeat("{a: ", 100) + "1" + Repeat("}", 100) +
           "}]\n",
       "nested too deeply"},
      {Repeat("[", 20000) + Repeat("]", 20000), ""},
  };
  for (const auto& c : cases) {
    auto r = ParseManifest(c.text);
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument)) << c.text.substr(0, 200);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.expected)) << c.text.substr(0, 200);
  }
}

TEST(Manifest, HostileFilesExitTwoFromWarm) {
  TempDir dir;
  const std::string bomb = dir.Sub("bomb.yaml");
  std::ofstream(bomb) << AliasBomb();
  for (const std::string& path : {bomb, std::string("/dev/zero")}) {
    CliRun r = Kcache({"warm", "--socket", dir.Sub("none.sock"), path});
    EXPECT_EQ(r.code, 2) << path << "\n" << Show(r);
    EXPECT_THAT(r.err, Not(IsEmpty()));
  }
}

TEST_F(StoreCli, ImportOfDevZeroOrAnythingElseExitsTwoAtOnce) {
  for (const std::string& path : {std::string("/dev/zero"), std::string("/dev/urandom")}) {
    CliRun r = Do({"import", "--allow-foreign-toolchain", path});
    EXPECT_EQ(r.code, 2) << Show(r);
    EXPECT_THAT(r.err, HasSubstr("not a kcache bundle")) << Show(r);
  }
  auto st = Store::Open(store_dir(), StoreOptions{});
  ASSERT_TRUE(st.ok());
  EXPECT_THAT((*st)->ImportFile("/dev/zero", ImportOptions{"", true}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(StoreCli, ALostCurrentIsReportedWithTheRepairAndRepairBringsTheEntriesBack) {
  std::filesystem::remove(store_dir() + "/CURRENT");
  for (const char* cmd : {"ls", "stats", "verify"}) {
    CliRun r = Do({cmd});
    EXPECT_EQ(r.code, 1) << Show(r);
    EXPECT_THAT(r.err, HasSubstr("CURRENT file is missing")) << Show(r);
    EXPECT_THAT(r.err, HasSubstr("kcache repair --store")) << Show(r);
  }
  EXPECT_FALSE(std::filesystem::exists(store_dir() + "/CURRENT"));
  CliRun via_daemon = Kcache({"repair", "--socket", "/nonexistent.sock"});
  EXPECT_EQ(via_daemon.code, 2) << Show(via_daemon);
  CliRun repaired = Do({"repair"});
  ASSERT_EQ(repaired.code, 0) << Show(repaired);
  EXPECT_THAT(repaired.out, HasSubstr("6 entries readable"));
  EXPECT_EQ(ListedKeys({}).size(), 6u);
}

TEST_F(StoreCli, ScansOfADamagedRecordsTableFinishAndSayWhatTheySkipped) {
  {
    // Flush the records to a table file, then flip one byte in it.
    auto s = Store::Open(store_dir(), StoreOptions{});
    ASSERT_TRUE(s.ok());
    std::vector<rocksdb::LiveFileMetaData> files;
    (*s)->raw_db_for_testing()->GetLiveFilesMetaData(&files);
    ASSERT_TRUE((*s)->Close().ok());
    for (const auto& f : files) {
      if (f.column_family_name != "records") continue;
      std::fstream io(store_dir() + f.name, std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(20);
      char c = 0;
      io.read(&c, 1);
      c ^= 0x08;
      io.seekp(20);
      io.write(&c, 1);
    }
  }
  for (const std::vector<std::string>& cmd : {std::vector<std::string>{"ls"},
                                              {"stats"},
                                              {"invalidate", "--arch", "sm_70"},
                                              {"gc", "--max-bytes", "1T"}}) {
    CliRun r = Do(cmd);
    EXPECT_EQ(r.code, 0) << Show(r);
    EXPECT_THAT(r.err, HasSubstr("skipped what could not be read: records: keys")) << Show(r);
    EXPECT_THAT(r.err, HasSubstr("kcache repair")) << Show(r);
  }
  CliRun v = Do({"verify"});
  EXPECT_EQ(v.code, 1) << Show(v);
  EXPECT_THAT(v.err, HasSubstr("skipped what could not be read")) << Show(v);
  CliRun x = Do({"export", "--out", dir_.Sub("x.kcb")});
  EXPECT_EQ(x.code, 0) << Show(x);
  CliRun repaired = Do({"repair"});
  ASSERT_EQ(repaired.code, 0) << Show(repaired);
  EXPECT_THAT(repaired.out, HasSubstr("moved to lost/"));
  CliRun clean = Do({"verify"});
  EXPECT_EQ(clean.code, 0) << Show(clean);
}

}  // namespace
}  // namespace kcache::tools
