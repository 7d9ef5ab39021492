// What the softmax families share (row_softmax.cc: the last dimension; split_softmax.cc: long last
// dimensions, a row over several blocks; dim_softmax.cc: any other):
// the three operators, their family names, which dimension a call normalizes, and the kind's
// compile options.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/op_signature.h"

namespace kforge::search::templates {

enum class Softmax : uint8_t { kSoftmax, kLog, kSafe };

// "softmax", "log_softmax", "safe_softmax", then `suffix`; "cpu." before it for the CPU.
std::string softmax_family_name(Softmax kind, Backend backend, std::string_view suffix = "");

// The dimension (0 to rank - 1) a call of `kind` normalizes when its arguments are ones the
// families take (a template tensor; half_to_float false, or _safe_softmax's dtype None), else -1.
int64_t softmax_call_dim(const OpSignature& sig, Softmax kind, Backend backend);

// -DKF_LOG and -DKF_SAFE for `kind`.
std::vector<std::string> softmax_kind_defines(Softmax kind);

// The CUDA softmax kernels' element functions (row_softmax.cc), after the prelude and the row
// mapping: kf_exp_shifted, kf_online_add/merge/warp, kf_row_online, kf_out and kf_finish (Note
// [Online softmax], Note [Safe softmax] there). Needs KF_LOG, KF_SAFE and the row mapping's knobs.
extern const char* const kCudaSoftmaxMath;

}  // namespace kforge::search::templates
