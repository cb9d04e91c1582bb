// Bundle format and Export/Import: round trip, refusal of damaged or foreign
// bundles with nothing written, and the committed fuzz corpus.
#include "cache/bundle.h"

#include <cstdlib>
#include <fstream>

#include "cache/digest.h"
#include "cache/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cache/test_util.h"

namespace kcache {
namespace {

using ::kcache::testing::IsOk;
using ::kcache::testing::MakeCubin;
using ::kcache::testing::MakeRecord;
using ::kcache::testing::MakeToolchain;
using ::kcache::testing::StatusIs;
using ::kcache::testing::TempDir;
using ::testing::HasSubstr;

std::string Encode(const std::vector<std::pair<v1::KernelRecord, std::string>>& entries) {
  std::string out;
  BundleWriter w([&](std::string_view p) {
    out.append(p);
    return absl::OkStatus();
  });
  EXPECT_TRUE(w.Begin().ok());
  for (auto [r, c] : entries) {
    r.set_format_version(1);
    r.set_cubin_sha256(std::string(AsBytes(Sha256(c))));
    r.set_cubin_size(c.size());
    EXPECT_TRUE(w.Add(r, c).ok());
  }
  EXPECT_TRUE(w.Finish().ok());
  return out;
}

std::vector<std::pair<v1::KernelRecord, std::string>> Sample(int n, int first = 0) {
  std::vector<std::pair<v1::KernelRecord, std::string>> v;
  for (int i = first; i < first + n; ++i) v.emplace_back(MakeRecord(i), MakeCubin(500 + i, i));
  return v;
}

TEST(BundleTest, RoundTrip) {
  std::string b = Encode(Sample(3));
  auto d = DecodeBundle(b);
  ASSERT_THAT(d, IsOk());
  ASSERT_EQ(d->size(), 3u);
  EXPECT_EQ((*d)[1].cubin, MakeCubin(501, 1));
  EXPECT_EQ((*d)[2].record.key(), MakeRecord(2).key());
  auto empty = DecodeBundle(Encode({}));
  ASSERT_THAT(empty, IsOk());
  EXPECT_TRUE(empty->empty());
}

TEST(BundleTest, RefusesDamagedOrForeignBytesNamingTheProblem) {
  const std::string good = Encode(Sample(2));
  auto expect = [](const std::string& bytes, absl::StatusCode code, const std::string& what) {
    auto d = DecodeBundle(bytes);
    EXPECT_THAT(d, StatusIs(code)) << what;
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(what));
  };
  expect("", absl::StatusCode::kInvalidArgument, "not a kcache bundle");
  expect("PK\x03\x04 a zip file", absl::StatusCode::kInvalidArgument, "not a kcache bundle");
  std::string v2 = good;
  v2[8] = 2;
  expect(v2, absl::StatusCode::kInvalidArgument, "format version 2");
  expect(good.substr(0, good.size() - 1), absl::StatusCode::kDataLoss, "truncated");
  expect(good.substr(0, good.size() / 2), absl::StatusCode::kDataLoss, "");
  expect(good + "x", absl::StatusCode::kDataLoss, "after the trailer");
  std::string flipped_cubin = good;
  flipped_cubin[good.size() - 60] ^= 1;  // inside the last cubin
  expect(flipped_cubin, absl::StatusCode::kDataLoss, "SHA-256");
  std::string flipped_sum = good;
  flipped_sum.back() ^= 1;
  expect(flipped_sum, absl::StatusCode::kDataLoss, "checksum");
  std::string flipped_count = good;
  flipped_count[good.size() - 40] ^= 1;  // the count's low byte
  expect(flipped_count, absl::StatusCode::kDataLoss, "trailer counts");
}

class ImportTest : public ::testing::Test {
 protected:
  std::unique_ptr<Store> Open(const std::string& name) {
    StoreOptions o;
    o.stats_flush_interval = absl::ZeroDuration();
    auto s = Store::Open(dir_.Sub(name), o);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }
  ImportOptions Current() {
    ImportOptions o;
    o.expected_toolchain_id = ToolchainIdHex(MakeToolchain());
    return o;
  }
  TempDir dir_;
};

TEST_F(ImportTest, ExportThenImportIntoAnotherStore) {
  auto a = Open("a");
  for (auto& [r, c] : Sample(5)) ASSERT_THAT(a->Publish(r, c), IsOk());
  ASSERT_THAT(a->Publish(MakeRecord(9, MakeToolchain(), "sm_80"), MakeCubin(10, 9)), IsOk());
  v1::Filter f;
  f.set_arch("sm_90a");
  auto ex = a->ExportToFile(f, dir_.Sub("out.kcb"));
  ASSERT_THAT(ex, IsOk());
  EXPECT_EQ(ex->exported, 5u);

  auto b = Open("b");
  auto im = b->ImportFile(dir_.Sub("out.kcb"), Current());
  ASSERT_THAT(im, IsOk());
  EXPECT_EQ(im->imported(), 5u);
  EXPECT_EQ(im->already_present(), 0u);
  for (auto& [r, c] : Sample(5)) {
    auto got = b->Lookup(r.key());
    ASSERT_THAT(got, IsOk());
    ASSERT_NE(*got, nullptr);
    EXPECT_EQ((*got)->cubin, c);
  }
  EXPECT_EQ(*b->Lookup(MakeRecord(9, MakeToolchain(), "sm_80").key()), nullptr);
  im = b->ImportFile(dir_.Sub("out.kcb"), Current());
  ASSERT_THAT(im, IsOk());
  EXPECT_EQ(im->imported(), 0u);
  EXPECT_EQ(im->already_present(), 5u);
}

TEST_F(ImportTest, DamagedBundleWritesNothing) {
  auto s = Open("s");
  std::string b = Encode(Sample(4));
  b[b.size() - 50] ^= 0x40;  // the last entry's cubin: the first three are fine
  auto im = s->Import(b, Current());
  EXPECT_THAT(im, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(im.status().message()), HasSubstr("frame 3"));
  EXPECT_EQ(s->Stats()->entries(), 0u);
  EXPECT_EQ(s->Stats()->blobs(), 0u);
  EXPECT_THAT(s->ImportFile(dir_.Sub("absent.kcb"), Current()),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ImportTest, ForeignToolchainNeedsTheOption) {
  auto s = Open("s");
  auto v = Sample(2);
  v.emplace_back(MakeRecord(7, MakeToolchain("12.8")), MakeCubin(99, 7));
  std::string b = Encode(v);
  auto im = s->Import(b, Current());
  EXPECT_THAT(im, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(im.status().message()), HasSubstr("allow_foreign_toolchain"));
  EXPECT_EQ(s->Stats()->entries(), 0u);
  EXPECT_THAT(s->Import(b, ImportOptions()), StatusIs(absl::StatusCode::kInvalidArgument));
  ImportOptions allow;
  allow.allow_foreign_toolchain = true;
  im = s->Import(b, allow);
  ASSERT_THAT(im, IsOk());
  EXPECT_EQ(im->imported(), 3u);
}

TEST_F(ImportTest, RecordWhoseKeyLiesAboutItsToolchainIsRefused) {
  auto v = Sample(1);
  *v[0].first.mutable_toolchain() = MakeToolchain("12.8");  // key still says 13.0
  auto d = DecodeBundle(Encode(v));
  EXPECT_THAT(d, StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("toolchain"));
}

// Regenerates the committed corpus (disabled: a skip would mark the whole
// binary skipped in CTest). Run with
//   KCACHE_WRITE_FUZZ_CORPUS=tests/cache/fuzz_corpus cache_bundle_test \
//     --gtest_also_run_disabled_tests --gtest_filter='*Regenerate*'
TEST(FuzzCorpus, DISABLED_Regenerate) {
  const char* dir = std::getenv("KCACHE_WRITE_FUZZ_CORPUS");
  ASSERT_NE(dir, nullptr) << "set KCACHE_WRITE_FUZZ_CORPUS=DIR";
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(std::string(dir) + "/" + name, std::ios::binary) << bytes;
  };
  // The harness's first byte picks the decoder: 'B' bundle, otherwise record.
  write("bundle-empty", "B" + Encode({}));
  write("bundle-two", "B" + Encode(Sample(2)));
  std::string v = Encode(Sample(1));
  write("bundle-truncated", "B" + v.substr(0, v.size() - 7));
  auto r = MakeRecord(3);
  r.set_format_version(1);
  r.set_cubin_sha256(std::string(AsBytes(Sha256("x"))));
  r.set_cubin_size(1);
  write("record-valid", "R" + r.SerializeAsString());
  r.set_key("short");
  write("record-bad-key", "R" + r.SerializeAsString());
}

}  // namespace
}  // namespace kcache
