// The hook's fast-path signature encoder (interposer/hook/signature_writer.h) against the
// runtime's OpSignature::encode(). The hook looks kernels up by the id it computes on the fast
// path, and the daemon, the cache and the worker compute ids with OpSignature: if the two
// encoders ever differ by one byte, every lookup misses. So for every argument kind, every
// integer width boundary of msgpack and every string length class, the writer's bytes must equal
// encode() and its id must equal id(). The torch half (reading the IValue stack) is checked by
// tests/python/test_hook_observe.py on real calls. The other torch-free parts of the hook, its
// configuration and its per-thread recorder, are specified at the end.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <thread>
#include <random>
#include <string>
#include <variant>

#include "interposer/hook/config.h"
#include "interposer/hook/recorder.h"
#include "interposer/hook/signature_writer.h"
#include "interposer/hook/target_arch.h"
#include "runtime/op_signature.h"
#include "tests/support/temp_dir.h"

using namespace kforge;
using kforge::hook::SignatureWriter;

namespace {

// Writes `sig` through the writer, argument by argument, the way the hook's stack walk does. With
// `pieces`, the head and the target are appended as SignaturePieces, as the interceptors do.
void write(const OpSignature& sig, SignatureWriter& w, bool pieces = false) {
  const auto nargs = static_cast<uint32_t>(sig.args.size());
  const hook::SignaturePiece head = hook::SignaturePiece::head(sig.op, sig.overload, nargs);
  const hook::SignaturePiece target = hook::SignaturePiece::target(sig.target.backend, sig.target.arch);
  if (pieces && head.valid()) {
    w.begin(head);
  } else {
    w.begin(sig.op, sig.overload, nargs);
  }
  for (const Arg& a : sig.args) {
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::monostate>) {
            w.none();
          } else if constexpr (std::is_same_v<V, TensorMeta>) {
            w.tensor(v.dtype, v.device, v.sizes.data(), v.strides.data(), v.sizes.size(), v.alignment);
          } else if constexpr (std::is_same_v<V, std::vector<TensorMeta>>) {
            w.tensor_list(static_cast<uint32_t>(v.size()));
            for (const TensorMeta& t : v) {
              w.tensor_list_item(t.dtype, t.device, t.sizes.data(), t.strides.data(), t.sizes.size(), t.alignment);
            }
          } else if constexpr (std::is_same_v<V, bool>) {
            w.boolean(v);
          } else if constexpr (std::is_same_v<V, int64_t>) {
            w.integer(v);
          } else if constexpr (std::is_same_v<V, double>) {
            w.real(v);
          } else if constexpr (std::is_same_v<V, std::string>) {
            w.string(v);
          } else {
            w.int_list(static_cast<uint32_t>(v.size()));
            for (int64_t i : v) w.int_list_item(i);
          }
        },
        a.value);
  }
  if (pieces && target.valid()) {
    w.append(target);
  } else {
    w.target(sig.target.backend, sig.target.arch);
  }
}

void require_same_as_runtime(const OpSignature& sig) {
  for (bool pieces : {false, true}) {
    SignatureWriter w;
    write(sig, w, pieces);
    REQUIRE(w.ok());
    INFO(sig.to_string() << (pieces ? " (head and target as pieces)" : ""));
    CHECK(w.bytes() == sig.encode());
    CHECK(w.id() == sig.id());
  }
}

TensorMeta tensor(DType dt, std::vector<int64_t> sizes, uint32_t alignment = 16,
                  DeviceType dev = DeviceType::kCpu) {
  TensorMeta t;
  t.dtype = dt;
  t.device = dev;
  t.sizes = sizes;
  t.strides.assign(sizes.size(), 1);
  // Random sizes make the product overflow: wrap it (unsigned) rather than rely on signed overflow.
  for (size_t d = sizes.size(); d-- > 1;) {
    t.strides[d - 1] = static_cast<int64_t>(static_cast<uint64_t>(t.strides[d]) * static_cast<uint64_t>(sizes[d]));
  }
  t.alignment = alignment;
  return t;
}

// Integers on both sides of every msgpack size class boundary.
std::vector<int64_t> boundary_integers() {
  std::vector<int64_t> v;
  for (int64_t b : {int64_t{0}, int64_t{31}, int64_t{32}, int64_t{127}, int64_t{128}, int64_t{255}, int64_t{256},
                    int64_t{32767}, int64_t{32768}, int64_t{65535}, int64_t{65536}, int64_t{2147483647},
                    int64_t{2147483648}, int64_t{4294967295}, int64_t{4294967296}}) {
    v.push_back(b);
    v.push_back(-b);
    v.push_back(b - 1);
    v.push_back(-b - 1);
  }
  v.push_back(std::numeric_limits<int64_t>::max());
  v.push_back(std::numeric_limits<int64_t>::min());
  return v;
}

}  // namespace

TEST_CASE("SignatureWriter: the catalog's call shapes encode exactly as OpSignature") {
  const Target cpu{Backend::kCpu, "x86_64-avx2"};
  const Target gpu{Backend::kCuda, "sm_90"};
  // What real calls look like: softmax(x, -1, false), layer_norm(x, [768], w, b, 1e-5),
  // group_norm(x, w, None, N, C, HxW, groups, eps), gelu(x, approximate='tanh'), add(x, y, alpha=1).
  require_same_as_runtime({"aten::_softmax", "", {Arg::tensor(tensor(DType::kFloat32, {8, 128})), Arg::integer(-1), Arg::boolean(false)}, cpu});
  require_same_as_runtime({"aten::native_layer_norm", "",
                           {Arg::tensor(tensor(DType::kBFloat16, {4, 77, 768}, 16, DeviceType::kCuda)), Arg::int_list({768}),
                            Arg::tensor(tensor(DType::kBFloat16, {768}, 16, DeviceType::kCuda)), Arg::none(), Arg::real(1e-5)},
                           gpu});
  require_same_as_runtime({"aten::native_group_norm", "",
                           {Arg::tensor(tensor(DType::kFloat32, {2, 64, 56, 56})), Arg::tensor(tensor(DType::kFloat32, {64})),
                            Arg::none(), Arg::integer(2), Arg::integer(64), Arg::integer(3136), Arg::integer(32), Arg::real(1e-5)},
                           cpu});
  require_same_as_runtime({"aten::gelu", "", {Arg::tensor(tensor(DType::kFloat16, {1024})), Arg::string("tanh")}, gpu});
  require_same_as_runtime({"aten::add", "Tensor",
                           {Arg::tensor(tensor(DType::kFloat32, {3, 1})), Arg::tensor(tensor(DType::kFloat32, {})), Arg::integer(1)},
                           cpu});
}

TEST_CASE("SignatureWriter: every integer size class encodes in msgpack-c's smallest form") {
  for (int64_t i : boundary_integers()) {
    require_same_as_runtime({"aten::x", "", {Arg::integer(i)}, {Backend::kCpu, "x"}});
  }
  require_same_as_runtime({"aten::x", "", {Arg::int_list(boundary_integers())}, {Backend::kCpu, "x"}});
  // Sizes and strides take the same forms (negative strides are legal in a signature).
  TensorMeta t = tensor(DType::kInt64, {70000, 300, 1});
  t.strides = {-5000000000, 40000, -129};
  require_same_as_runtime({"aten::x", "", {Arg::tensor(t)}, {Backend::kCpu, "x"}});
}

TEST_CASE("SignatureWriter: floats are float64 with one NaN, signed zeros kept apart") {
  for (double d : {0.0, -0.0, 1.0, -2.5, 1e-300, 1e300, std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::denorm_min()}) {
    require_same_as_runtime({"aten::x", "", {Arg::real(d)}, {Backend::kCpu, "x"}});
  }
  // Any NaN payload encodes as the one canonical NaN, on both sides.
  const double odd_nan = std::bit_cast<double>(uint64_t{0xfff0000000000123});
  REQUIRE(std::isnan(odd_nan));
  require_same_as_runtime({"aten::x", "", {Arg::real(odd_nan)}, {Backend::kCpu, "x"}});
  SignatureWriter a;
  SignatureWriter b;
  write({"aten::x", "", {Arg::real(odd_nan)}, {Backend::kCpu, "x"}}, a);
  write({"aten::x", "", {Arg::real(std::nan(""))}, {Backend::kCpu, "x"}}, b);
  CHECK(a.id() == b.id());
}

TEST_CASE("SignatureWriter: strings of every length class, lists, None and alignments") {
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{255}, size_t{256}, size_t{700}}) {
    require_same_as_runtime({"aten::x", std::string(n % 40, 'o'), {Arg::string(std::string(n, 's'))}, {Backend::kCuda, "sm_100"}});
  }
  require_same_as_runtime({"aten::cat", "",
                           {Arg::tensor_list({tensor(DType::kBool, {2, 3}, 2), tensor(DType::kComplex128, {0}, 16),
                                              tensor(DType::kFloat8E5M2, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 16}, 1)}),
                            Arg::integer(0), Arg::tensor_list({}), Arg::int_list({}), Arg::none(), Arg::boolean(true)},
                           {Backend::kCpu, "aarch64"}});
  // 16 and more arguments or list elements take msgpack's array16 header.
  std::vector<Arg> many(20, Arg::integer(3));
  require_same_as_runtime({"aten::x", "", many, {Backend::kCpu, "x"}});
}

TEST_CASE("SignatureWriter: random signatures match the runtime encoder") {
  std::mt19937_64 rng(20240607);
  auto pick = [&](uint64_t n) { return static_cast<size_t>(rng() % n); };
  const std::vector<int64_t> ints = boundary_integers();
  for (int round = 0; round < 2000; ++round) {
    OpSignature s;
    s.op = "aten::op" + std::to_string(pick(1000));
    s.overload = pick(2) ? "" : "Tensor";
    s.target = {pick(2) ? Backend::kCpu : Backend::kCuda, pick(2) ? "sm_90" : "x86_64-avx512f"};
    const size_t nargs = pick(8);
    for (size_t i = 0; i < nargs; ++i) {
      auto random_tensor = [&] {
        std::vector<int64_t> sizes(pick(kMaxTensorRank + 1));
        for (int64_t& d : sizes) d = static_cast<int64_t>(pick(3000));
        TensorMeta t = tensor(static_cast<DType>(pick(kDTypeCount)), sizes, 1u << pick(9),
                              pick(2) ? DeviceType::kCpu : DeviceType::kCuda);
        if (pick(4) == 0 && !t.strides.empty()) t.strides[pick(t.strides.size())] = ints[pick(ints.size())];
        return t;
      };
      switch (pick(8)) {
        case 0: s.args.push_back(Arg::none()); break;
        case 1: s.args.push_back(Arg::tensor(random_tensor())); break;
        case 2: {
          std::vector<TensorMeta> list(pick(4));
          for (TensorMeta& t : list) t = random_tensor();
          s.args.push_back(Arg::tensor_list(list));
          break;
        }
        case 3: s.args.push_back(Arg::boolean(pick(2) == 1)); break;
        case 4: s.args.push_back(Arg::integer(ints[pick(ints.size())])); break;
        case 5: s.args.push_back(Arg::real(std::bit_cast<double>(rng()))); break;
        case 6: s.args.push_back(Arg::string(std::string(pick(300), 'a'))); break;
        default: {
          std::vector<int64_t> list(pick(20));
          for (int64_t& x : list) x = ints[pick(ints.size())];
          s.args.push_back(Arg::int_list(list));
        }
      }
    }
    SignatureWriter w;
    write(s, w, /*pieces=*/round % 2 == 1);
    if (!w.ok()) {
      // Only signatures longer than the buffer may be refused.
      CHECK(s.encode().size() > hook::kSignatureBufferBytes);
      continue;
    }
    INFO("round " << round << ": " << s.to_string());
    REQUIRE(w.bytes() == s.encode());
    REQUIRE(w.id() == s.id());
  }
}

TEST_CASE("SignatureWriter: a signature longer than the buffer is refused, never truncated") {
  SignatureWriter w;
  write({"aten::x", "", {Arg::string(std::string(hook::kSignatureBufferBytes, 'x'))}, {Backend::kCpu, "x"}}, w);
  CHECK_FALSE(w.ok());
  // The writer is reusable: begin() starts over.
  const OpSignature small{"aten::x", "", {Arg::integer(1)}, {Backend::kCpu, "x"}};
  write(small, w);
  CHECK(w.ok());
  CHECK(w.bytes() == small.encode());
}

TEST_CASE("SignatureWriter: refused exactly when the encoding is longer than the buffer, wherever the limit falls") {
  // The writer checks room once per group of bytes (Note [Writer bounds]): a whole tensor of rank
  // <= 16, a header, a string. Padding with a string of every length moves the limit through every
  // byte of the groups after it, including a rank-16 tensor of 9-byte integers and a rank-20
  // tensor, which the writer takes value by value.
  TensorMeta wide = tensor(DType::kInt64, std::vector<int64_t>(kMaxTensorRank, 5000000000));
  TensorMeta deep = tensor(DType::kFloat32, std::vector<int64_t>(20, 200));
  for (const TensorMeta& last : {wide, deep}) {
    for (size_t pad = 300; pad <= hook::kSignatureBufferBytes; ++pad) {
      const OpSignature s{"aten::x", "", {Arg::string(std::string(pad, 'p')), Arg::tensor(last), Arg::integer(-70000)},
                          {Backend::kCpu, "x86_64-avx2"}};
      const std::string encoded = s.encode();
      for (bool pieces : {false, true}) {
        SignatureWriter w;
        write(s, w, pieces);
        INFO("pad " << pad << ", " << encoded.size() << " bytes" << (pieces ? ", pieces" : ""));
        REQUIRE(w.ok() == (encoded.size() <= hook::kSignatureBufferBytes));
        if (w.ok()) REQUIRE(w.bytes() == encoded);
      }
    }
  }
}

TEST_CASE("SignaturePiece: an operator's head and a target, encoded once, append the bytes begin() and target() write") {
  using hook::SignaturePiece;
  const OpSignature sig{"aten::native_layer_norm", "",
                        {Arg::tensor(tensor(DType::kBFloat16, {4, 77, 768})), Arg::int_list({768}), Arg::none(),
                         Arg::none(), Arg::real(1e-5)},
                        {Backend::kCuda, "sm_90"}};
  const SignaturePiece head = SignaturePiece::head(sig.op, sig.overload, static_cast<uint32_t>(sig.args.size()));
  const SignaturePiece target = SignaturePiece::target(sig.target.backend, sig.target.arch);
  REQUIRE(head.valid());
  REQUIRE(target.valid());
  SignatureWriter w;
  w.begin(head);
  w.tensor(DType::kBFloat16, DeviceType::kCpu, std::vector<int64_t>{4, 77, 768}.data(),
           tensor(DType::kBFloat16, {4, 77, 768}).strides.data(), 3, 16);
  w.int_list(1);
  w.int_list_item(768);
  w.none();
  w.none();
  w.real(1e-5);
  w.append(target);
  REQUIRE(w.ok());
  CHECK(w.bytes() == sig.encode());
  CHECK(w.id() == sig.id());

  // begin(head) starts over, like begin(op, overload, nargs): a writer that overflowed is reusable.
  SignatureWriter x;
  write({"aten::x", "", {Arg::string(std::string(hook::kSignatureBufferBytes, 'x'))}, {Backend::kCpu, "x"}}, x);
  REQUIRE_FALSE(x.ok());
  const OpSignature small{"aten::x", "", {Arg::integer(1)}, {Backend::kCpu, "x86_64"}};
  x.begin(SignaturePiece::head(small.op, small.overload, 1));
  x.integer(1);
  x.append(SignaturePiece::target(Backend::kCpu, "x86_64"));
  CHECK(x.ok());
  CHECK(x.bytes() == small.encode());

  // TargetArch keeps the CPU target's piece, and has none where the arch is unknown.
  const hook::TargetArch arch("x86_64-avx2");
  REQUIRE(arch.cpu_target() != nullptr);
  CHECK(arch.cpu_target()->bytes() == SignaturePiece::target(Backend::kCpu, "x86_64-avx2").bytes());
  CHECK(hook::TargetArch("").cpu_target() == nullptr);
  hook::TargetArch cuda("x86_64");
  CHECK(cuda.cuda_target(-1) == nullptr);
  CHECK(cuda.cuda_target(hook::TargetArch::kMaxCudaDevices) == nullptr);

  // Longer than a piece holds: not valid, and callers write the values instead.
  CHECK_FALSE(SignaturePiece::head("aten::" + std::string(80, 'o'), "", 1).valid());
  CHECK_FALSE(SignaturePiece::target(Backend::kCpu, std::string(80, 'a')).valid());
  CHECK(SignaturePiece::head("aten::" + std::string(40, 'o'), std::string(10, 'v'), 1).valid());
}

TEST_CASE("pointer_alignment: the largest power of two up to 16 that divides the address") {
  using hook::pointer_alignment;
  auto at = [](uintptr_t a) { return reinterpret_cast<const void*>(a); };
  CHECK(pointer_alignment(nullptr) == 16);   // an empty tensor's data pointer
  CHECK(pointer_alignment(at(0x1000)) == 16);
  CHECK(pointer_alignment(at(0x7f0000000100)) == 16);
  CHECK(pointer_alignment(at(0x7f0000000080)) == 16);   // 128-, 64- and 16-aligned are one key
  CHECK(pointer_alignment(at(0x7f0000000010)) == 16);
  CHECK(pointer_alignment(at(0x7f0000000008)) == 8);
  CHECK(pointer_alignment(at(0x7f0000000004)) == 4);
  CHECK(pointer_alignment(at(0x7f0000000001)) == 1);
  CHECK(pointer_alignment(at(0x7f0000000006)) == 2);
}

TEST_CASE("HookConfig: defaults, one warning per bad value, and operator selection") {
  using namespace kforge::hook;
  auto env_of = [](std::map<std::string, std::string> m) -> EnvLookup {
    return [m](const char* name) -> std::optional<std::string> {
      auto it = m.find(name);
      if (it == m.end()) return std::nullopt;
      return it->second;
    };
  };
  HookConfig d = parse_config(env_of({{"XDG_RUNTIME_DIR", "/run/user/1000"}}));
  CHECK(d.warnings.empty());
  CHECK(d.daemon_endpoint == "ipc:///run/user/1000/kforge/daemon.sock");
  CHECK(d.mode == HookMode::kObserve);
  CHECK(d.sample_rate == 64);
  CHECK(d.observe_every == 16);
  CHECK(d.to_string().find(" observe_every=16 ") != std::string::npos);
  CHECK(d.report_interval_ms == 1000);
  CHECK_FALSE(d.capture_inputs);
  CHECK_FALSE(d.bench_toggle);
  CHECK(d.to_string().find("bench_toggle") == std::string::npos);
  CHECK(d.op_selected("aten::gelu", ""));
  CHECK(default_daemon_endpoint("", 1234) == "ipc:///tmp/kforge-1234/daemon.sock");

  HookConfig bad = parse_config(env_of({{"KFORGE_SAMPLE_RATE", "often"},
                                        {"KFORGE_REPORT_INTERVAL_MS", "0"},
                                        {"KFORGE_MODE", "turbo"},
                                        {"KFORGE_DAEMON_ENDPOINT", "/tmp/sock"},
                                        {"KFORGE_LOG", "maybe"},
                                        {"KFORGE_BENCH_TOGGLE", "sometimes"},
                                        {"KFORGE_OBSERVE_EVERY", "0"}}));
  REQUIRE(bad.warnings.size() == 7);
  CHECK(bad.warnings[3] == "KFORGE_OBSERVE_EVERY='0' is not an integer in 1..4096; using 16");
  CHECK(bad.observe_every == 16);
  CHECK(parse_config(env_of({{"KFORGE_OBSERVE_EVERY", "1"}})).observe_every == 1);
  CHECK(bad.warnings[6].find("KFORGE_BENCH_TOGGLE='sometimes'") != std::string::npos);
  CHECK_FALSE(bad.bench_toggle);
  CHECK(bad.warnings[0].find("KFORGE_DAEMON_ENDPOINT='/tmp/sock'") != std::string::npos);
  CHECK(bad.warnings[1].find("KFORGE_MODE='turbo'") != std::string::npos);
  CHECK(bad.warnings[2] == "KFORGE_SAMPLE_RATE='often' is not an integer in 1..1000000; using 64");
  CHECK(bad.sample_rate == 64);
  CHECK(bad.report_interval_ms == 1000);
  CHECK(bad.mode == HookMode::kObserve);

  HookConfig shadow = parse_config(env_of({{"KFORGE_MODE", "shadow"}}));
  CHECK(shadow.mode == HookMode::kShadow);
  CHECK(shadow.requested_mode == HookMode::kShadow);
  CHECK(shadow.warnings.empty());
  // tcp:// needs the daemon's CURVE public key; without a valid one, the default endpoint.
  const std::string key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";   // libzmq's test vector
  HookConfig tcp = parse_config(env_of({{"KFORGE_DAEMON_ENDPOINT", "tcp://10.0.0.5:5555"},
                                        {"KFORGE_DAEMON_SERVER_KEY", " " + key + "\n"}}));
  CHECK(tcp.warnings.empty());
  CHECK(tcp.daemon_endpoint == "tcp://10.0.0.5:5555");
  CHECK(tcp.daemon_server_key == key);
  HookConfig no_key = parse_config(env_of({{"KFORGE_DAEMON_ENDPOINT", "tcp://10.0.0.5:5555"}}));
  REQUIRE(no_key.warnings.size() == 1);
  CHECK(no_key.warnings[0].find("is tcp://, which kforged serves only with CURVE: set KFORGE_DAEMON_SERVER_KEY") !=
        std::string::npos);
  CHECK(no_key.daemon_endpoint.starts_with("ipc://"));
  CHECK(no_key.daemon_server_key.empty());
  HookConfig bad_key = parse_config(env_of({{"KFORGE_DAEMON_ENDPOINT", "tcp://10.0.0.5:5555"},
                                            {"KFORGE_DAEMON_SERVER_KEY", key.substr(1)}}));
  REQUIRE(bad_key.warnings.size() == 1);
  CHECK(bad_key.warnings[0].find("KFORGE_DAEMON_SERVER_KEY is 39 characters long") == 0);
  CHECK(bad_key.daemon_endpoint.starts_with("ipc://"));
  HookConfig odd_key = parse_config(env_of({{"KFORGE_DAEMON_ENDPOINT", "tcp://10.0.0.5:5555"},
                                            {"KFORGE_DAEMON_SERVER_KEY", key.substr(1) + "~"}}));
  REQUIRE(odd_key.warnings.size() == 1);
  CHECK(odd_key.warnings[0].find("outside the z85 alphabet") != std::string::npos);
  HookConfig ipc_key = parse_config(env_of({{"KFORGE_DAEMON_SERVER_KEY", key}}));
  REQUIRE(ipc_key.warnings.size() == 1);
  CHECK(ipc_key.warnings[0].find("is not tcp://") != std::string::npos);
  CHECK(ipc_key.daemon_server_key.empty());

  HookConfig toggle = parse_config(env_of({{"KFORGE_BENCH_TOGGLE", "1"}}));
  CHECK(toggle.bench_toggle);
  CHECK(toggle.to_string().find(" bench_toggle=on") != std::string::npos);
  CHECK(parse_config(env_of({{"KFORGE_MODE", " active "}})).mode == HookMode::kActive);

  HookConfig sel = parse_config(env_of({{"KFORGE_OPS", "add.Tensor, aten::_softmax,gelu,bogus"},
                                        {"KFORGE_DENY_OPS", "aten::gelu"}}));
  REQUIRE(sel.warnings.size() == 1);
  CHECK(sel.warnings[0].find("KFORGE_OPS: 'bogus' is not a catalog operator") == 0);
  CHECK(sel.op_selected("aten::add", "Tensor"));
  CHECK(sel.op_selected("aten::_softmax", ""));
  CHECK_FALSE(sel.op_selected("aten::gelu", ""));          // denied wins
  CHECK_FALSE(sel.op_selected("aten::_log_softmax", ""));  // not allowed
  // An allow list with no valid name is a bad value: one line, and the default (every operator).
  HookConfig none = parse_config(env_of({{"KFORGE_OPS", "bogus, nonsense"}}));
  REQUIRE(none.warnings.size() == 1);
  CHECK(none.warnings[0].find("KFORGE_OPS='bogus, nonsense' is not a list of catalog operators (") == 0);
  CHECK(none.warnings[0].find("; using every catalog operator") != std::string::npos);
  CHECK(none.op_selected("aten::add", "Tensor"));
  CHECK_FALSE(none.ops_restricted);
  HookConfig two_bad = parse_config(env_of({{"KFORGE_OPS", "gelu,bogus,nonsense"}}));
  REQUIRE(two_bad.warnings.size() == 1);
  CHECK(two_bad.warnings[0].find("KFORGE_OPS: 'bogus', 'nonsense' are not catalog operators") == 0);
  HookConfig bad_deny = parse_config(env_of({{"KFORGE_DENY_OPS", "bogus"}}));
  REQUIRE(bad_deny.warnings.size() == 1);
  CHECK(bad_deny.warnings[0].find("; using none denied") != std::string::npos);
  CHECK(bad_deny.op_selected("aten::gelu", ""));
  // An empty cache directory is a bad value too, not silently the default.
  HookConfig empty_cache = parse_config(env_of({{"KFORGE_CACHE_DIR", ""}}));
  REQUIRE(empty_cache.warnings.size() == 1);
  CHECK(empty_cache.warnings[0].find("KFORGE_CACHE_DIR='' is not a directory; using the default") == 0);
  CHECK(empty_cache.cache_dir.empty());
  CHECK(op_name_matches("aten::add", "aten::add", "Tensor"));
  CHECK_FALSE(op_name_matches("add.Scalar", "aten::add", "Tensor"));
}

TEST_CASE("HookConfig: KFORGE_SUMMARY_DIR is recorded as given and checked against the file system") {
  using namespace kforge::hook;
  auto env_of = [](std::map<std::string, std::string> m) -> EnvLookup {
    return [m](const char* name) -> std::optional<std::string> {
      auto it = m.find(name);
      if (it == m.end()) return std::nullopt;
      return it->second;
    };
  };
  // Unset or empty: no summary, no line. Blanks alone: one line, no summary.
  CHECK(parse_config(env_of({})).summary_dir.empty());
  HookConfig empty = parse_config(env_of({{"KFORGE_SUMMARY_DIR", ""}}));
  CHECK(empty.summary_dir.empty());
  CHECK(empty.warnings.empty());
  HookConfig blank = parse_config(env_of({{"KFORGE_SUMMARY_DIR", "  "}}));
  CHECK(blank.summary_dir.empty());
  REQUIRE(blank.warnings.size() == 1);
  CHECK(blank.warnings[0] == "KFORGE_SUMMARY_DIR='  ' is not a directory; using no summary");
  HookConfig set = parse_config(env_of({{"KFORGE_SUMMARY_DIR", "out/summaries"}}));
  CHECK(set.warnings.empty());
  CHECK(set.summary_dir == "out/summaries");   // as given: the file system is resolve_summary_dir's
  CHECK(set.to_string().find(" summary_dir=out/summaries") != std::string::npos);
  CHECK(parse_config(env_of({})).to_string().find("summary_dir") == std::string::npos);

  // A writable directory comes back absolute (the program may chdir before it exits).
  kforge::test_support::TempDir t("kforge-summary-dir");
  const SummaryDir ok = resolve_summary_dir(t.path.string());
  CHECK(ok.problem.empty());
  CHECK(ok.path == std::filesystem::canonical(t.path).string());
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(t.path.parent_path());
  const SummaryDir relative = resolve_summary_dir(t.path.filename().string());
  std::filesystem::current_path(cwd);
  CHECK(relative.path == ok.path);

  // Each bad directory: no path, and one line naming the variable, the value and what is wrong.
  const SummaryDir missing = resolve_summary_dir(t / "missing");
  CHECK(missing.path.empty());
  CHECK(missing.problem == "KFORGE_SUMMARY_DIR='" + (t / "missing") + "' does not exist; no summary will be written");
  { std::ofstream(t / "file") << "x"; }
  const SummaryDir file = resolve_summary_dir(t / "file");
  CHECK(file.path.empty());
  CHECK(file.problem == "KFORGE_SUMMARY_DIR='" + (t / "file") + "' is not a directory; no summary will be written");
  CHECK(resolve_summary_dir(t / "file/below").problem.find("' does not exist;") != std::string::npos);
  // Root may write anywhere, so the permission case is only checkable as another user.
  if (::geteuid() != 0) {
    std::filesystem::create_directory(t / "ro");
    ::chmod((t / "ro").c_str(), 0500);
    const SummaryDir ro = resolve_summary_dir(t / "ro");
    CHECK(ro.path.empty());
    CHECK(ro.problem.find("KFORGE_SUMMARY_DIR='" + (t / "ro") + "' is not writable (") == 0);
    ::chmod((t / "ro").c_str(), 0700);
  }
}

// ---- Recorder: the per-thread counters behind the fast path -----------------------------------
// (torch-free as well; here rather than in a file of its own because this file is the hook's
// torch-free test.) One Recorder per process, as in the hook: the cases below share it and look
// only at their own signatures and at differences of the global counters.

namespace {

hook::Recorder& shared_recorder() {
  static hook::Recorder* r = [] {
    hook::RecorderOptions o;
    o.endpoint = "ipc:///tmp/kforge-recorder-test-nobody.sock";   // nobody serves it
    o.sample_rate = 8;
    o.report_interval_ms = 10;
    o.hello.kforge_version = "test";
    auto* rec = new hook::Recorder(std::move(o));
    rec->start();
    return rec;
  }();
  return *r;
}

OpSignature numbered(const std::string& op, int64_t i) {
  return OpSignature{op, "", {Arg::integer(i)}, {Backend::kCpu, "x86_64"}};
}

std::unique_ptr<OpSignature> copy_of(void* context) {
  return std::make_unique<OpSignature>(*static_cast<const OpSignature*>(context));
}
std::unique_ptr<OpSignature> cannot_build(void*) { return nullptr; }

const hook::RecorderStats::Signature* find(const hook::RecorderStats& st, const SignatureId& id) {
  for (const auto& s : st.signatures) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("Recorder: counts from many threads add up exactly, read while they run and after they exit") {
  hook::Recorder& r = shared_recorder();
  constexpr int kThreads = 8;
  constexpr int kCalls = 20000;
  constexpr int kSignatures = 32;
  std::vector<OpSignature> sigs;
  for (int i = 0; i < kSignatures; ++i) sigs.push_back(numbered("aten::threads", i));

  std::atomic<bool> done{false};
  uint64_t reads = 0;
  bool monotonic = true;
  std::thread reader([&] {
    // Stats are merged under the recorder's lock while the workers count without one.
    uint64_t last = 0;
    while (!done.load()) {
      uint64_t total = 0;
      for (const auto& s : r.stats().signatures) {
        if (s.signature.op == "aten::threads") total += s.calls;
      }
      monotonic = monotonic && total >= last;
      last = total;
      ++reads;
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < kCalls; ++i) {
        OpSignature& sig = sigs[static_cast<size_t>(i % kSignatures)];
        hook::Recorder::Call c = r.on_call(sig.id(), &copy_of, &sig, /*timeable=*/true);
        if (c.sample) hook::Recorder::add_sample(c.slot, 1);
      }
    });
  }
  for (std::thread& w : workers) w.join();   // their tables are folded into the totals on exit
  done = true;
  reader.join();
  CHECK(reads > 0);
  CHECK(monotonic);

  const hook::RecorderStats st = r.stats();
  uint64_t sampled = 0;
  for (const OpSignature& sig : sigs) {
    const auto* s = find(st, sig.id());
    REQUIRE(s != nullptr);
    CHECK(s->signature == sig);
    CHECK(s->calls == uint64_t{kThreads} * kCalls / kSignatures);
    CHECK(s->sampled_ns == s->sampled_calls);
    sampled += s->sampled_calls;
  }
  // Each thread times the first call of each signature and then one in sample_rate (8) of it.
  const uint64_t per_signature = uint64_t{kCalls} / kSignatures;
  CHECK(sampled == uint64_t{kThreads} * kSignatures * ((per_signature + 7) / 8));

  // The reporter builds a report of them on request (nobody serves the endpoint: it is dropped).
  REQUIRE(r.report_now(10000));
  CHECK(r.stats().reports_built >= 1);
}

TEST_CASE("Recorder: signatures that cannot be built or disagree are counted as unknown, once each") {
  hook::Recorder& r = shared_recorder();
  const hook::RecorderStats before = r.stats();
  const OpSignature a = numbered("aten::unbuildable", 1);
  for (int i = 0; i < 10; ++i) {
    hook::Recorder::Call c = r.on_call(a.id(), &cannot_build, nullptr, false);
    CHECK_FALSE(c.id_mismatch);
  }
  // The fast path claims an id the built signature does not have: a kforge bug, reported once.
  const OpSignature b = numbered("aten::mismatch", 2);
  hook::Recorder::Call first = r.on_call(numbered("aten::other", 3).id(), &copy_of, const_cast<OpSignature*>(&b), false);
  CHECK(first.id_mismatch);
  const hook::RecorderStats after = r.stats();
  CHECK(after.unknown_calls - before.unknown_calls == 11);
  CHECK(after.id_mismatches - before.id_mismatches == 1);
  CHECK(find(after, a.id()) == nullptr);
  CHECK(find(after, b.id()) == nullptr);
}

TEST_CASE("Recorder: a thread's full table counts further new signatures as overflow") {
  hook::Recorder& r = shared_recorder();
  const hook::RecorderStats before = r.stats();
  std::thread t([&] {
    for (int i = 0; i < 400; ++i) {
      OpSignature sig = numbered("aten::many", i);
      (void)r.on_call(sig.id(), &copy_of, &sig, false);
    }
  });
  t.join();
  const hook::RecorderStats after = r.stats();
  CHECK(after.overflow_calls - before.overflow_calls == 400 - 384);
  CHECK(after.signatures.size() - before.signatures.size() == 384);
  CHECK(after.threads - before.threads == 1);
}

TEST_CASE("secure_ipc_directory: the hook connects only into a private socket directory of its own") {
  using hook::secure_ipc_directory;
  char tmpl[] = "/tmp/kforge-ipc-test-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string base = tmpl;
  // Missing: created, 0700.
  CHECK(secure_ipc_directory("ipc://" + base + "/new/daemon.sock").ok());
  struct stat st {};
  REQUIRE(::stat((base + "/new").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  // Group/other permissions: refused with the fix.
  REQUIRE(::mkdir((base + "/open").c_str(), 0755) == 0);
  REQUIRE(::chmod((base + "/open").c_str(), 0755) == 0);
  Status open = secure_ipc_directory("ipc://" + base + "/open/daemon.sock");
  REQUIRE_FALSE(open.ok());
  CHECK_THAT(open.message(), Catch::Contains("has mode 0755 (must be 0700)"));
  // A symlink, even to a good directory: refused.
  REQUIRE(::symlink((base + "/new").c_str(), (base + "/link").c_str()) == 0);
  Status link = secure_ipc_directory("ipc://" + base + "/link/daemon.sock");
  REQUIRE_FALSE(link.ok());
  CHECK_THAT(link.message(), Catch::Contains("symbolic link"));
  // Another owner (only root can hand a directory over).
  if (::geteuid() == 0) {
    REQUIRE(::mkdir((base + "/theirs").c_str(), 0700) == 0);
    REQUIRE(::chown((base + "/theirs").c_str(), 65534, 65534) == 0);
    Status theirs = secure_ipc_directory("ipc://" + base + "/theirs/daemon.sock");
    REQUIRE_FALSE(theirs.ok());
    CHECK_THAT(theirs.message(), Catch::Contains("owned by uid 65534"));
  }
  // Not ipc: not this check's business; relative ipc paths are refused.
  CHECK(secure_ipc_directory("tcp://127.0.0.1:5555").ok());
  CHECK_FALSE(secure_ipc_directory("ipc://relative/daemon.sock").ok());
  std::string cmd = "rm -rf " + base;
  REQUIRE(std::system(cmd.c_str()) == 0);
}
