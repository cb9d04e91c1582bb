// Only in kcached-static: the four libunwind calls that Debian's libglog.a
// makes to take a stack trace (glog's stacktrace_libunwind: getcontext,
// init_local, then get_reg(IP) and step per frame), answered with the C++
// runtime's own unwinder (_Unwind_Backtrace from libgcc_eh).
//
// Why not link libunwind.a: Debian builds it without -fPIC, so it cannot go
// into kcached-static, which is a PIE; and it defines the _Unwind_* entry
// points itself, which would take exceptions over from libgcc's unwinder.
// glog only takes stack traces on LOG(FATAL) / a failed CHECK, so the trace
// has to be right, not fast. The shared build uses the real libunwind.
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#include <unwind.h>

#include <cstdint>

namespace {

// The cursor holds the whole trace: [0] frames, [1] position, [2...] IPs.
constexpr int kHeader = 2;
constexpr int kMaxFrames = UNW_TDEP_CURSOR_LEN - kHeader;

struct Collect {
  unw_word_t* words;
};

_Unwind_Reason_Code AddFrame(struct _Unwind_Context* context, void* arg) {
  unw_word_t* w = static_cast<Collect*>(arg)->words;
  if (w[0] >= static_cast<unw_word_t>(kMaxFrames)) return _URC_END_OF_STACK;
  w[kHeader + w[0]] = static_cast<unw_word_t>(_Unwind_GetIP(context));
  ++w[0];
  return _URC_NO_REASON;
}

}  // namespace

extern "C" {

int unw_getcontext(unw_context_t*) { return 0; }  // init_local takes the trace

int unw_init_local(unw_cursor_t* cursor, unw_context_t*) {
  cursor->opaque[0] = 0;
  cursor->opaque[1] = 0;
  Collect c{cursor->opaque};
  _Unwind_Backtrace(&AddFrame, &c);
  // The first frame is this function, which the caller did not ask for.
  cursor->opaque[1] = cursor->opaque[0] > 0 ? 1 : 0;
  return 0;
}

int unw_get_reg(unw_cursor_t* cursor, unw_regnum_t reg, unw_word_t* value) {
  const unw_word_t* w = cursor->opaque;
  if (reg != UNW_REG_IP || w[1] >= w[0]) return -UNW_EBADREG;
  *value = w[kHeader + w[1]];
  return 0;
}

int unw_step(unw_cursor_t* cursor) {
  unw_word_t* w = cursor->opaque;
  if (w[1] + 1 >= w[0]) return 0;
  ++w[1];
  return 1;
}

}  // extern "C"
