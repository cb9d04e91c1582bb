// Cubin ELF reading (see cubin_elf.h). The one adapter from llvm::Error /
// llvm::Expected to absl::Status for object files is ToStatus below.
#include "compiler/llvm/cubin_elf.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/cuda/cubin_images.h"
#include "llvm/BinaryFormat/ELF.h"
#include "llvm/Object/ELFObjectFile.h"
#include "llvm/Object/ObjectFile.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

namespace kcache {
namespace {

absl::Status ToStatus(llvm::Error e, absl::string_view what) {
  if (!e) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", llvm::toString(std::move(e))));
}

// .nv.info attribute formats and the codes read here (cuobjdump -elf names).
constexpr uint8_t kFmtNval = 0x01;  // no value
constexpr uint8_t kFmtBval = 0x02;  // one byte
constexpr uint8_t kFmtHval = 0x03;  // two bytes
constexpr uint8_t kFmtSval = 0x04;  // two-byte size, then that many bytes
constexpr uint8_t kMaxThreads = 0x05;
constexpr uint8_t kFrameSize = 0x11;
constexpr uint8_t kCbankParamSize = 0x19;
constexpr uint8_t kMaxStackSize = 0x23;
constexpr uint8_t kRegCount = 0x2f;

uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

struct Attribute {
  uint8_t code;
  std::string_view value;  // HVAL: two bytes; SVAL: its payload
};

// Splits an .nv.info section into attributes; false (with what was read)
// on an unknown format or a truncated record.
bool ParseNvInfo(std::string_view data, std::vector<Attribute>* out) {
  size_t i = 0;
  while (i + 2 <= data.size()) {
    const uint8_t fmt = static_cast<uint8_t>(data[i]);
    const uint8_t code = static_cast<uint8_t>(data[i + 1]);
    i += 2;
    switch (fmt) {
      case kFmtNval:
        out->push_back({code, {}});
        break;
      case kFmtBval:
      case kFmtHval: {
        // BVAL is padded to the same two-byte slot as HVAL.
        if (i + 2 > data.size()) return false;
        out->push_back({code, data.substr(i, 2)});
        i += 2;
        break;
      }
      case kFmtSval: {
        if (i + 2 > data.size()) return false;
        const size_t n = static_cast<uint8_t>(data[i]) | static_cast<uint8_t>(data[i + 1]) << 8;
        i += 2;
        if (i + n > data.size()) return false;
        out->push_back({code, data.substr(i, n)});
        i += n;
        break;
      }
      default:
        return false;
    }
  }
  return i == data.size();
}

// One image's kernels, in ELF order (ReadCubin sorts them).
absl::StatusOr<CubinInfo> ReadImage(absl::string_view cubin);

}  // namespace

absl::StatusOr<CubinInfo> ReadCubin(absl::string_view cubin) {
  absl::StatusOr<std::vector<std::string_view>> images =
      SplitCubinImages(std::string_view(cubin.data(), cubin.size()));
  if (!images.ok()) return images.status();
  CubinInfo all;
  for (size_t i = 0; i < images->size(); ++i) {
    absl::StatusOr<CubinInfo> one =
        ReadImage(absl::string_view((*images)[i].data(), (*images)[i].size()));
    if (!one.ok()) {
      if (images->size() == 1) return one.status();
      return absl::Status(one.status().code(),
                          absl::StrCat("image ", i, ": ", one.status().message()));
    }
    if (i == 0) {
      all.arch = one->arch;
    } else if (one->arch != all.arch) {
      all.notes.push_back(absl::StrCat("image ", i, " is for ", one->arch, ", not ", all.arch));
    }
    for (CubinKernel& k : one->kernels) {
      k.image = static_cast<int>(i);
      all.kernels.push_back(std::move(k));
    }
    for (std::string& n : one->notes) {  // once, whichever images say it
      if (std::find(all.notes.begin(), all.notes.end(), n) == all.notes.end()) {
        all.notes.push_back(std::move(n));
      }
    }
  }
  all.images = static_cast<int>(images->size());
  std::stable_sort(all.kernels.begin(), all.kernels.end(),  // stable: image order kept
                   [](const CubinKernel& a, const CubinKernel& b) {
                     return a.entry != b.entry ? a.entry : a.name < b.name;
                   });
  return all;
}

namespace {

absl::StatusOr<CubinInfo> ReadImage(absl::string_view cubin) {
  auto buffer = llvm::MemoryBuffer::getMemBuffer(llvm::StringRef(cubin.data(), cubin.size()),
                                                 "cubin", /*RequiresNullTerminator=*/false);
  llvm::Expected<std::unique_ptr<llvm::object::ObjectFile>> object =
      llvm::object::ObjectFile::createObjectFile(buffer->getMemBufferRef());
  if (!object) return ToStatus(object.takeError(), "cubin: not an object file LLVM can read");
  auto* elf = llvm::dyn_cast<llvm::object::ELF64LEObjectFile>(object->get());
  if (elf == nullptr) return absl::InvalidArgumentError("cubin: not a 64-bit little-endian ELF");
  const auto& header = elf->getELFFile().getHeader();
  if (header.e_machine != llvm::ELF::EM_CUDA) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cubin: ELF machine ", static_cast<unsigned>(header.e_machine), ", not EM_CUDA (190)"));
  }
  CubinInfo info;
  const uint32_t flags = static_cast<uint32_t>(header.e_flags);
  // ELF ABI version 7 (CUDA <= 12) keeps the SM in bits 0-7 and flags
  // sm_XXa with EF_CUDA_ACCELERATORS; version 8 (CUDA 13) keeps it in bits
  // 8-15 and the header of an sm_90a cubin equals sm_90's, so the suffix is
  // taken from ptxas's command line in .note.nv.tkinfo when it is there.
  const unsigned abi = header.e_ident[llvm::ELF::EI_ABIVERSION];
  const unsigned sm = abi >= 8 ? (flags >> 8) & 0xff : flags & 0xff;
  const bool accel = abi < 8 && (flags & llvm::ELF::EF_CUDA_ACCELERATORS) != 0;
  info.arch = absl::StrCat("sm_", sm, accel ? "a" : "");
  // Sections by name; symbols (functions) by name, with their indices in
  // the symbol table, which the .nv.info records refer to.
  std::map<std::string, llvm::object::SectionRef> sections;
  for (const llvm::object::SectionRef& s : elf->sections()) {
    llvm::Expected<llvm::StringRef> name = s.getName();
    if (!name) {
      llvm::consumeError(name.takeError());
      continue;
    }
    sections.emplace(name->str(), s);
  }
  auto section_size = [&](const std::string& name) -> int64_t {
    auto it = sections.find(name);
    return it == sections.end() ? -1 : static_cast<int64_t>(it->second.getSize());
  };
  auto section_data = [&](const std::string& name, std::string_view* out) -> bool {
    auto it = sections.find(name);
    if (it == sections.end()) return false;
    llvm::Expected<llvm::StringRef> c = it->second.getContents();
    if (!c) {
      llvm::consumeError(c.takeError());
      return false;
    }
    *out = std::string_view(c->data(), c->size());
    return true;
  };

  if (std::string_view notes; section_data(".note.nv.tkinfo", &notes)) {
    // "... -arch sm_90a -c ..." (NUL-separated strings).
    const size_t at = notes.find("-arch sm_");
    if (at != std::string_view::npos) {
      size_t end = at + 6;
      while (end < notes.size() &&
             (std::isalnum(static_cast<unsigned char>(notes[end])) || notes[end] == '_')) {
        ++end;
      }
      const std::string_view told = notes.substr(at + 6, end - at - 6);
      if (told.substr(0, info.arch.size()) == info.arch) info.arch = std::string(told);
    }
  }

  bool reserved_smem = false;
  std::map<uint32_t, size_t> by_symbol_index;  // symbol table index -> kernels[i]
  for (const llvm::object::ELFSymbolRef& sym : elf->symbols()) {
    llvm::Expected<llvm::StringRef> name = sym.getName();
    if (!name) {
      llvm::consumeError(name.takeError());
      continue;
    }
    if (name->starts_with(".nv.reservedSmem")) reserved_smem = true;
    if (sym.getELFType() != llvm::ELF::STT_FUNC) continue;
    CubinKernel k;
    k.name = name->str();
    k.entry = (sym.getOther() & 0x10) != 0;  // STO_CUDA_ENTRY
    k.code_bytes = section_size(".text." + k.name);
    const int64_t smem = section_size(".nv.shared." + k.name);
    k.static_smem_bytes = smem < 0 ? 0 : smem;
    // An ELF symbol reference holds (symbol table section, index).
    const uint32_t index = sym.getRawDataRefImpl().d.b;
    by_symbol_index[index] = info.kernels.size();
    info.kernels.push_back(std::move(k));
  }

  // The module-wide .nv.info: per-function figures keyed by symbol index.
  std::string_view global;
  if (section_data(".nv.info", &global)) {
    std::vector<Attribute> attrs;
    if (!ParseNvInfo(global, &attrs)) {
      info.notes.push_back(".nv.info: an attribute of unknown format; later ones not read");
    }
    for (const Attribute& a : attrs) {
      if (a.value.size() != 8) continue;
      const auto* p = reinterpret_cast<const uint8_t*>(a.value.data());
      auto it = by_symbol_index.find(Le32(p));
      if (it == by_symbol_index.end()) continue;
      CubinKernel& k = info.kernels[it->second];
      const int64_t v = Le32(p + 4);
      if (a.code == kRegCount) k.registers = v;
      if (a.code == kFrameSize) k.frame_bytes = v;
      if (a.code == kMaxStackSize) k.max_stack_bytes = v;
    }
  } else {
    info.notes.push_back("no .nv.info section: registers and frame sizes unknown");
  }
  // Per-kernel .nv.info.<name>: parameter bytes, declared block size.
  for (CubinKernel& k : info.kernels) {
    std::string_view data;
    if (!section_data(".nv.info." + k.name, &data)) continue;
    std::vector<Attribute> attrs;
    if (!ParseNvInfo(data, &attrs)) {
      info.notes.push_back(absl::StrCat(".nv.info.", k.name,
                                        ": an attribute of unknown format; later ones not read"));
    }
    for (const Attribute& a : attrs) {
      const auto* p = reinterpret_cast<const uint8_t*>(a.value.data());
      if (a.code == kCbankParamSize && a.value.size() == 2) k.param_bytes = p[0] | p[1] << 8;
      if (a.code == kMaxThreads && a.value.size() == 12) {
        k.max_threads = int64_t{Le32(p)} * Le32(p + 4) * Le32(p + 8);
      }
    }
  }
  if (reserved_smem) {
    info.notes.push_back(
        "static shared memory is the size of .nv.shared.<kernel>, which here includes the "
        "shared memory the driver reserves (.nv.reservedSmem, 1 KiB on sm_90)");
  }
  return info;  // in ELF order: ReadCubin sorts every image's kernels together
}

}  // namespace

}  // namespace kcache
