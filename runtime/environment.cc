#include "runtime/environment.h"

#include <sys/utsname.h>

#include <cstdio>
#include <fstream>
#include <limits>

#include "runtime/msgpack_codec.h"

namespace kforge {

// Note [Canonical environment encoding]
// An environment is the msgpack array
//   [format_version, backend, arch, device_model, driver_version, nvrtc_version, compiler,
//    torch_version]
// with integers in their smallest form (msgpack-c's default) and backend as its enum value.
// format_version comes first so that a reader meeting a newer layout can say so instead of
// reporting a confusing arity or type error. Decoding is strict (exactly 8 elements): this is a
// key, and a field this build does not know about must make entries miss, not be ignored.
namespace {

constexpr size_t kEnvironmentFields = 8;

// Logs must show "" and embedded quotes unambiguously: a missing torch version and a version
// named with a space are both real causes of misses.
std::string quote_for_log(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

codec::Reader field(const codec::Reader& r, size_t i, std::string_view name) {
  return codec::Reader(r.at(i).object(), r.path() + "." + std::string(name));
}

StatusOr<int32_t> read_version_number(const codec::Reader& r) {
  KFORGE_ASSIGN_OR_RETURN(int64_t v, r.i64_in(0, std::numeric_limits<int32_t>::max()));
  return static_cast<int32_t>(v);
}

}  // namespace

std::string Environment::encode() const {
  msgpack::sbuffer buf;
  codec::Packer pk(buf);
  codec::pack(pk, *this);
  return std::string(buf.data(), buf.size());
}

StatusOr<Environment> Environment::decode(std::string_view bytes) {
  codec::Limits limits;
  limits.max_bytes = 4096;
  limits.max_array = kEnvironmentFields + 8;
  limits.max_map = 0;
  limits.max_str = kMaxEnvironmentString;
  limits.max_bin = kMaxEnvironmentString;
  limits.max_depth = 2;
  KFORGE_ASSIGN_OR_RETURN(msgpack::object_handle oh, codec::parse(bytes, limits));
  return codec::read_environment(codec::Reader(oh.get(), "environment"));
}

EnvironmentKey Environment::key() const { return hash128(encode()); }

std::string Environment::to_string() const {
  std::string s;
  s += "backend=" + std::string(backend_name(backend));
  s += " arch=" + quote_for_log(arch);
  s += " device_model=" + quote_for_log(device_model);
  s += " driver_version=" + std::to_string(driver_version);
  s += " nvrtc_version=" + std::to_string(nvrtc_version);
  s += " compiler=" + quote_for_log(compiler);
  s += " torch_version=" + quote_for_log(torch_version);
  s += " format_version=" + std::to_string(format_version);
  return s;
}

std::vector<std::string> Environment::differences(const Environment& other) const {
  std::vector<std::string> out;
  auto diff = [&out](std::string_view name, const std::string& a, const std::string& b) {
    out.push_back(std::string(name) + ": " + a + " != " + b);
  };
  if (backend != other.backend) {
    diff("backend", std::string(backend_name(backend)), std::string(backend_name(other.backend)));
  }
  if (arch != other.arch) diff("arch", quote_for_log(arch), quote_for_log(other.arch));
  if (device_model != other.device_model) {
    diff("device_model", quote_for_log(device_model), quote_for_log(other.device_model));
  }
  if (driver_version != other.driver_version) {
    diff("driver_version", std::to_string(driver_version), std::to_string(other.driver_version));
  }
  if (nvrtc_version != other.nvrtc_version) {
    diff("nvrtc_version", std::to_string(nvrtc_version), std::to_string(other.nvrtc_version));
  }
  if (compiler != other.compiler) diff("compiler", quote_for_log(compiler), quote_for_log(other.compiler));
  if (torch_version != other.torch_version) {
    diff("torch_version", quote_for_log(torch_version), quote_for_log(other.torch_version));
  }
  if (format_version != other.format_version) {
    diff("format_version", std::to_string(format_version), std::to_string(other.format_version));
  }
  return out;
}

Environment cpu_host_environment(std::string torch_version) {
  Environment env;
  env.backend = Backend::kCpu;
  env.torch_version = std::move(torch_version);

  struct utsname u {};
  env.arch = uname(&u) == 0 ? std::string(u.machine) : std::string("unknown");
#if defined(__x86_64__)
  // CPU candidates are compiled for the widest ISA the host has (-march=native in the worker),
  // so a kernel built on an AVX-512 host must miss on an AVX2-only one.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    env.arch += "-avx512f";
  } else if (__builtin_cpu_supports("avx2")) {
    env.arch += "-avx2";
  } else if (__builtin_cpu_supports("sse4.2")) {
    env.arch += "-sse4.2";
  }
#endif

  // Timings are per CPU model as much as per GPU model. A missing /proc (containers, non-Linux)
  // leaves the field empty, which is still a consistent key on that host.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    size_t start = line.find_first_not_of(" \t", colon + 1);
    if (start != std::string::npos) env.device_model = line.substr(start, kMaxEnvironmentString);
    break;
  }
  return env;
}

namespace codec {

void pack(Packer& pk, const Environment& env) {
  pk.pack_array(static_cast<uint32_t>(kEnvironmentFields));
  pk.pack_uint32(env.format_version);
  pk.pack_uint8(static_cast<uint8_t>(env.backend));
  pk.pack(env.arch);
  pk.pack(env.device_model);
  pk.pack_int32(env.driver_version);
  pk.pack_int32(env.nvrtc_version);
  pk.pack(env.compiler);
  pk.pack(env.torch_version);
}

StatusOr<Environment> read_environment(const Reader& r) {
  KFORGE_ASSIGN_OR_RETURN(size_t n, r.array_size());
  if (n == 0) return r.error("expected " + std::to_string(kEnvironmentFields) + " elements, got 0");
  Environment env;
  {
    KFORGE_ASSIGN_OR_RETURN(uint64_t fv, field(r, 0, "format_version").u64());
    if (fv > std::numeric_limits<uint32_t>::max()) {
      return field(r, 0, "format_version").error("value " + std::to_string(fv) + " exceeds uint32");
    }
    env.format_version = static_cast<uint32_t>(fv);
  }
  if (n != kEnvironmentFields) {
    if (env.format_version != kFormatVersion) {
      return r.error("environment format version " + std::to_string(env.format_version) +
                     " is not readable by this build (format version " +
                     std::to_string(kFormatVersion) + ")");
    }
    return r.error("expected " + std::to_string(kEnvironmentFields) + " elements, got " +
                   std::to_string(n));
  }
  {
    // Only values kforge defines are accepted: an unknown backend cannot name a loadable kernel.
    KFORGE_ASSIGN_OR_RETURN(int64_t b,
                            field(r, 1, "backend").i64_in(0, static_cast<int64_t>(Backend::kCuda)));
    env.backend = static_cast<Backend>(b);
  }
  KFORGE_ASSIGN_OR_RETURN(env.arch, field(r, 2, "arch").str(kMaxEnvironmentString));
  KFORGE_ASSIGN_OR_RETURN(env.device_model, field(r, 3, "device_model").str(kMaxEnvironmentString));
  KFORGE_ASSIGN_OR_RETURN(env.driver_version, read_version_number(field(r, 4, "driver_version")));
  KFORGE_ASSIGN_OR_RETURN(env.nvrtc_version, read_version_number(field(r, 5, "nvrtc_version")));
  KFORGE_ASSIGN_OR_RETURN(env.compiler, field(r, 6, "compiler").str(kMaxEnvironmentString));
  KFORGE_ASSIGN_OR_RETURN(env.torch_version, field(r, 7, "torch_version").str(kMaxEnvironmentString));
  return env;
}

}  // namespace codec
}  // namespace kforge
