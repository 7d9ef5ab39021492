// The operators the hook intercepts: the catalog kforge searches kernels for. Registration
// (interceptor.cc) and the KFORGE_OPS / KFORGE_DENY_OPS lists (config.cc) both read it.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace kforge::hook {

struct CatalogOp {
  std::string_view name;       // "aten::add", as OpSignature::op
  std::string_view overload;   // "Tensor"; "" for the default overload, as OpSignature::overload

  // "aten::add.Tensor": the dispatcher's spelling, used in logs and stats.
  std::string qualified() const {
    std::string s(name);
    if (!overload.empty()) {
      s += '.';
      s += overload;
    }
    return s;
  }
};

inline constexpr std::array<CatalogOp, 7> kCatalog = {{
    {"aten::_softmax", ""},
    {"aten::_log_softmax", ""},
    {"aten::native_layer_norm", ""},
    {"aten::native_group_norm", ""},
    {"aten::gelu", ""},
    {"aten::silu", ""},
    {"aten::add", "Tensor"},
}};

}  // namespace kforge::hook
