// LLVM IR -> PTX (see llvm_nvptx.h).
#include "compiler/llvm/llvm_nvptx.h"

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/IR/CallingConv.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/Intrinsics.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Metadata.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/IRReader/IRReader.h"
#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/TargetParser/Triple.h"

extern "C" {
void LLVMInitializeNVPTXTargetInfo();
void LLVMInitializeNVPTXTarget();
void LLVMInitializeNVPTXTargetMC();
void LLVMInitializeNVPTXAsmPrinter();
}

namespace kcache {
namespace {

constexpr char kTriple[] = "nvptx64-nvidia-cuda";

bool Newer(const LlvmVersion& a, const LlvmVersion& b) {
  return std::tie(a.major, a.minor) > std::tie(b.major, b.minor);
}

// The release at the start of `s` ("22.1.8", "23.0.0git (https://...)"), or
// nullopt when `s` does not start with major.minor.
std::optional<LlvmVersion> ParseVersionAt(absl::string_view s) {
  auto number = [&s](int* out) {
    size_t n = 0;
    while (n < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[n]))) ++n;
    const bool ok = n > 0 && n < 6 && absl::SimpleAtoi(s.substr(0, n), out);
    s.remove_prefix(n);
    return ok;
  };
  const absl::string_view all = s;
  LlvmVersion v;
  if (!number(&v.major) || s.empty() || s[0] != '.') return std::nullopt;
  s.remove_prefix(1);
  if (!number(&v.minor)) return std::nullopt;
  v.text = std::string(all.substr(0, all.find_first_of(" \t\"(),;")));
  return v;
}

// "... LLVM 23.0.0 ...", "LLVM23.0.0git", "clang version 23.0.0 (...)": the
// release named after "LLVM" or "clang version", or nullopt.
std::optional<LlvmVersion> FindVersion(absl::string_view s) {
  for (absl::string_view marker : {"clang version ", "LLVM "}) {
    if (size_t at = s.find(marker); at != absl::string_view::npos) {
      return ParseVersionAt(s.substr(at + marker.size()));
    }
  }
  if (absl::StartsWith(s, "LLVM")) return ParseVersionAt(s.substr(4));
  return std::nullopt;
}

// The strings of a textual module's !llvm.ident, read without parsing the
// module: IR this LLVM cannot parse still says which LLVM wrote it.
std::vector<absl::string_view> IdentStrings(absl::string_view ir) {
  std::vector<absl::string_view> out;
  const size_t at = ir.find("\n!llvm.ident = !{");
  if (at == absl::string_view::npos) return out;
  const size_t open = ir.find('{', at);
  const size_t close = ir.find('}', open);
  if (close == absl::string_view::npos) return out;
  for (absl::string_view ref : absl::StrSplit(ir.substr(open + 1, close - open - 1), ',')) {
    ref = absl::StripAsciiWhitespace(ref);
    if (ref.size() < 2 || ref[0] != '!') continue;
    const std::string def = absl::StrCat("\n", ref, " = !{!\"");  // !7 = !{!"clang version ..."}
    const size_t d = ir.find(def);
    if (d == absl::string_view::npos) continue;
    const size_t b = d + def.size();
    const size_t e = ir.find('"', b);
    if (e != absl::string_view::npos) out.push_back(ir.substr(b, e - b));
  }
  return out;
}

void InitNvptxOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
}

std::string ToString(const llvm::SMDiagnostic& d) {
  std::string s;
  llvm::raw_string_ostream os(s);
  d.print("raw.source", os, /*ShowColors=*/false);
  return os.str();
}

// Functions named kernels by the legacy !nvvm.annotations metadata.
std::set<const llvm::Function*> AnnotatedKernels(const llvm::Module& m) {
  std::set<const llvm::Function*> out;
  const llvm::NamedMDNode* md = m.getNamedMetadata("nvvm.annotations");
  if (md == nullptr) return out;
  for (const llvm::MDNode* node : md->operands()) {
    // {ptr @f, !"kernel", i32 1, ...}: key/value pairs after the function.
    if (node->getNumOperands() < 3) continue;
    auto* fn = llvm::mdconst::dyn_extract_or_null<llvm::Function>(node->getOperand(0));
    if (fn == nullptr) continue;
    for (unsigned i = 1; i + 1 < node->getNumOperands(); i += 2) {
      auto* key = llvm::dyn_cast_or_null<llvm::MDString>(node->getOperand(i));
      auto* value = llvm::mdconst::dyn_extract_or_null<llvm::ConstantInt>(node->getOperand(i + 1));
      if (key && value && key->getString() == "kernel" && value->isOne()) out.insert(fn);
    }
  }
  return out;
}

// IR with debug info (even line tables only, as Triton emits by default)
// makes LLVM declare ".target sm_XX, debug", and ptxas refuses optimized code
// for such a target ("Optimized debugging not supported"). Triton drops the
// flag from its own PTX the same way; the .loc lines and DWARF sections stay,
// and ptxas accepts them.
void DropDebugTarget(std::string& ptx) {
  const size_t line = ptx.find("\n.target ");  // after LLVM's comment header
  if (line == std::string::npos) return;
  const size_t end = ptx.find('\n', line + 1);
  const size_t flag = ptx.find(", debug", line + 1);
  if (flag != std::string::npos && (end == std::string::npos || flag < end)) ptx.erase(flag, 7);
}

}  // namespace

LlvmVersion LinkedLlvmVersion() {
  return LlvmVersion{LLVM_VERSION_MAJOR, LLVM_VERSION_MINOR, LLVM_VERSION_STRING};
}

std::optional<LlvmVersion> DeclaredLlvmVersion(absl::string_view ir, bool bitcode) {
  if (bitcode) {
    llvm::Expected<std::string> producer = llvm::getBitcodeProducerString(
        llvm::MemoryBufferRef(llvm::StringRef(ir.data(), ir.size()), "raw.source"));
    if (!producer) {
      llvm::consumeError(producer.takeError());
      return std::nullopt;
    }
    return FindVersion(*producer);
  }
  // The newest release any ident names (a module linked from several).
  std::optional<LlvmVersion> newest;
  for (absl::string_view ident : IdentStrings(ir)) {
    std::optional<LlvmVersion> v = FindVersion(ident);
    if (v && (!newest || Newer(*v, *newest))) newest = std::move(v);
  }
  return newest;
}

absl::StatusOr<std::string> LlvmIrToPtx(absl::string_view ir, const IrToPtxOptions& options) {
  InitNvptxOnce();
  if (ir.empty()) return absl::InvalidArgumentError("raw.source: empty");
  const bool looks_bitcode =
      ir.size() >= 4 && ir.substr(0, 4) == absl::string_view("BC\xC0\xDE", 4);
  if (options.bitcode != looks_bitcode) {
    return absl::InvalidArgumentError(
        options.bitcode ? "raw.source: FORMAT_LLVM_BITCODE, but the bytes do not start with the "
                          "bitcode magic 'BC' 0xC0DE"
                        : "raw.source: FORMAT_LLVM_IR (text), but the bytes are LLVM bitcode");
  }
  // IR is read by the LLVM that wrote it or a later one, never an earlier
  // one (new attributes, calling conventions, intrinsics, bitcode records):
  // refuse what says it is newer before LLVM misreads it.
  const LlvmVersion linked = LinkedLlvmVersion();
  const std::optional<LlvmVersion> declared = DeclaredLlvmVersion(ir, options.bitcode);
  if (declared && Newer(*declared, linked)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw.source: written by LLVM ", declared->text, ", newer than the LLVM ", linked.text,
        " that kcache links; LLVM reads IR of its own release or older only. Send PTX, or IR "
        "from LLVM ",
        linked.major, ".", linked.minor, " or older"));
  }
  // Textual IR: LLVM's parser wants a NUL-terminated buffer.
  std::unique_ptr<llvm::MemoryBuffer> buffer =
      llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(ir.data(), ir.size()), "raw.source");
  llvm::LLVMContext context;
  llvm::SMDiagnostic diag;
  std::unique_ptr<llvm::Module> module = llvm::parseIR(buffer->getMemBufferRef(), diag, context);
  if (module == nullptr) {
    // Most IR does not say which LLVM wrote it (Triton's does not); a parse
    // error is then the usual sign of a newer one.
    return absl::InvalidArgumentError(absl::StrCat(
        "raw.source: LLVM ", linked.text, " cannot parse it: ", ToString(diag),
        declared ? ""
                 : absl::StrCat(" (IR from an LLVM newer than ", linked.text,
                                " can use syntax this one does not know; send PTX, or IR from "
                                "LLVM ",
                                linked.major, ".", linked.minor, " or older)")));
  }
  {
    std::string errors;
    llvm::raw_string_ostream os(errors);
    if (llvm::verifyModule(*module, &os)) {
      return absl::InvalidArgumentError(
          absl::StrCat("raw.source: the LLVM IR verifier rejects it: ", os.str()));
    }
  }
  const llvm::Triple triple(kTriple);
  const llvm::Triple& module_triple = module->getTargetTriple();
  if (!module_triple.str().empty() && module_triple.getArch() != llvm::Triple::nvptx64) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw.source: target triple \"", module_triple.str(), "\" is not ", kTriple));
  }
  module->setTargetTriple(triple);

  // A declaration named llvm.* that this LLVM has no intrinsic for (IR written
  // by a newer LLVM that does not say so)
  // passes the verifier and would be emitted as a call to an external function
  // of that name, which ptxas then rejects with a bare syntax error.
  for (const llvm::Function& f : *module) {
    if (f.isDeclaration() && !f.use_empty() && f.getName().starts_with("llvm.") &&
        f.getIntrinsicID() == llvm::Intrinsic::not_intrinsic) {
      return absl::InvalidArgumentError(absl::StrCat(
          "raw.source: uses @", f.getName().str(), ", which is not an intrinsic of LLVM ",
          LLVM_VERSION_STRING, " (IR from a newer LLVM can name intrinsics this one lacks)"));
    }
  }

  const std::set<const llvm::Function*> annotated = AnnotatedKernels(*module);
  for (size_t i = 0; i < options.kernel_names.size(); ++i) {
    const std::string& name = options.kernel_names[i];
    const llvm::Function* f = module->getFunction(name);
    if (f == nullptr || f->isDeclaration()) {
      return absl::InvalidArgumentError(absl::StrCat("raw.kernel_names[", i, "]: no function \"",
                                                     name, "\" is defined in the IR"));
    }
    if (f->getCallingConv() != llvm::CallingConv::PTX_Kernel && !annotated.count(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("raw.kernel_names[", i, "]: \"", name,
                       "\" is not a kernel (give it the ptx_kernel calling convention or an "
                       "!nvvm.annotations \"kernel\" entry)"));
    }
    if (options.enable_test_faults && name == "kcache_test_llvm_fatal") {
      // Test hook (KCACHE_TEST_RAW_FAULTS=1 only): LLVM's own abort path.
      llvm::report_fatal_error("kcache test fault: LLVM fatal error requested", true);
    }
  }

  std::string error;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(triple, error);
  if (target == nullptr) {
    return absl::InternalError(absl::StrCat("LLVM has no NVPTX target: ", error));
  }
  {
    std::unique_ptr<llvm::MCSubtargetInfo> sti(
        target->createMCSubtargetInfo(triple, options.arch, ""));
    if (sti == nullptr || !sti->isCPUStringValid(options.arch)) {
      return absl::InvalidArgumentError(absl::StrCat("target.arch: LLVM ", LLVM_VERSION_STRING,
                                                     "'s NVPTX backend does not know \"",
                                                     options.arch, "\""));
    }
  }
  llvm::TargetOptions target_options;
  std::unique_ptr<llvm::TargetMachine> machine(
      target->createTargetMachine(triple, options.arch, "", target_options, std::nullopt,
                                  std::nullopt, llvm::CodeGenOptLevel::Aggressive));
  if (machine == nullptr) {
    return absl::InternalError(
        absl::StrCat("LLVM could not create an NVPTX target machine for ", options.arch));
  }
  if (module->getDataLayoutStr().empty()) module->setDataLayout(machine->createDataLayout());

  llvm::SmallString<0> ptx;
  llvm::raw_svector_ostream out(ptx);
  llvm::legacy::PassManager passes;
  if (machine->addPassesToEmitFile(passes, out, nullptr, llvm::CodeGenFileType::AssemblyFile)) {
    return absl::InternalError("LLVM's NVPTX target cannot emit PTX");
  }
  passes.run(*module);
  std::string text(ptx.str());
  DropDebugTarget(text);
  return text;
}

}  // namespace kcache
