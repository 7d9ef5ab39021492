// KernelSpec and its launch plan: what a candidate kernel is, how it is stored, and how its plan
// becomes concrete launch numbers for one signature. These tests pin down that the encoding is
// canonical and round-trips exactly, that every malformed spec is rejected with the field named,
// and that resolve() gives the numbers (and output layouts) a launcher can use as they are.
#include <catch2/catch.hpp>

#include <msgpack.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "runtime/kernel_spec.h"
#include "runtime/launch_args.h"
#include "runtime/launch_expr.h"
#include "runtime/msgpack_codec.h"

using namespace kforge;

namespace {

TensorMeta tensor(DType dt, std::vector<int64_t> sizes, std::vector<int64_t> strides = {}) {
  TensorMeta t = contiguous_tensor(dt, DeviceType::kCuda, std::move(sizes));
  if (!strides.empty()) t.strides = std::move(strides);
  return t;
}

// aten::_softmax(bfloat16[4096, 50257], dim=-1, half_to_float=false) on sm_90.
OpSignature softmax_signature() {
  return OpSignature{"aten::_softmax", "",
                     {Arg::tensor(tensor(DType::kBFloat16, {4096, 50257})), Arg::integer(-1), Arg::boolean(false)},
                     Target{Backend::kCuda, "sm_90"}};
}

// A two-pass row softmax: per-row statistics into scratch, then the normalized output.
KernelSpec softmax_spec() {
  KernelSpec s;
  s.backend = Backend::kCuda;
  s.language = SourceLanguage::kCuda;
  s.source = "extern \"C\" __global__ void row_stats(...) {}\nextern \"C\" __global__ void normalize(...) {}\n";
  s.entry_points = {"row_stats", "normalize"};
  s.compile_options = {"--use_fast_math", "-DVEC=8"};
  s.plan.scratch = {{"row_max", "numel0 / size0_1 * 4"}, {"row_sum", "numel0 / size0_1 * 4"}};
  s.plan.outputs = {OutputSpec::like(0),
                    OutputSpec::explicit_layout(DType::kFloat32, {"numel0 / size0_1"}, {"1"})};
  Launch stats;
  stats.entry = "row_stats";
  stats.grid = {"numel0 / size0_1", "1", "1"};
  stats.block = {"min(1024, round_up(ceil_div(size0_1, 8), 32))", "1", "1"};
  stats.shared_mem_bytes = "ceil_div(min(1024, round_up(ceil_div(size0_1, 8), 32)), 32) * 8";
  stats.args = {ArgBinding::input(0), ArgBinding::scratch(0), ArgBinding::scratch(1),
                ArgBinding::size("size0_1", ValueType::kInt32), ArgBinding::size("stride0_0")};
  Launch norm;
  norm.entry = "normalize";
  norm.grid = {"ceil_div(size0_1, 2048)", "numel0 / size0_1", "1"};
  norm.block = {"256", "1", "1"};
  norm.args = {ArgBinding::input(0),
               ArgBinding::output(0),
               ArgBinding::output(1),
               ArgBinding::scratch(0),
               ArgBinding::scratch(1),
               ArgBinding::size("size0_1", ValueType::kInt32),
               ArgBinding::scalar(1, ValueType::kInt64),
               ArgBinding::scalar(2, ValueType::kBool),
               ArgBinding::scalar(1, ValueType::kFloat32)};
  s.plan.launches = {stats, norm};
  return s;
}

// A minimal valid spec for CPU.
KernelSpec cpu_spec() {
  KernelSpec s;
  s.backend = Backend::kCpu;
  s.language = SourceLanguage::kCpp;
  s.source = "extern \"C\" void run(...) {}";
  s.entry_points = {"run"};
  Launch l;
  l.entry = "run";
  l.args = {ArgBinding::input(0)};
  s.plan.launches = {l};
  return s;
}

// Re-encodes `bytes` with the element at `path` (array indices from the top) replaced by what
// `replace` packs: how the tests build inputs that encode() would never produce.
void repack(codec::Packer& pk, const msgpack::object& o, const std::vector<size_t>& path, size_t depth,
            const std::function<void(codec::Packer&)>& replace) {
  if (depth == path.size()) {
    replace(pk);
    return;
  }
  REQUIRE(o.type == msgpack::type::ARRAY);
  REQUIRE(path[depth] < o.via.array.size);
  pk.pack_array(o.via.array.size);
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    if (i == path[depth]) {
      repack(pk, o.via.array.ptr[i], path, depth + 1, replace);
    } else {
      pk.pack(o.via.array.ptr[i]);
    }
  }
}

std::string replaced(const KernelSpec& spec, const std::vector<size_t>& path,
                     const std::function<void(codec::Packer&)>& replace) {
  const std::string bytes = spec.encode();
  msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size());
  msgpack::sbuffer buf;
  codec::Packer pk(buf);
  repack(pk, oh.get(), path, 0, replace);
  return std::string(buf.data(), buf.size());
}

Status decode_error(std::string_view bytes) {
  auto s = KernelSpec::decode(bytes);
  REQUIRE_FALSE(s.ok());
  return s.status();
}

// The error names `field` first: "launches[0].grid[1]: ...".
void check_field(const Status& s, const std::string& field) {
  INFO(s.message());
  CHECK(s.message().rfind(field + ": ", 0) == 0);
}

Status validate_error(const KernelSpec& s) {
  Status st = s.validate();
  REQUIRE_FALSE(st.ok());
  // decode() of the same spec must reject it with the same message.
  auto d = KernelSpec::decode(s.encode());
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message() == st.message());
  return st;
}

Status resolve_error(const KernelSpec& s, const OpSignature& sig = softmax_signature()) {
  auto r = s.resolve(sig);
  REQUIRE_FALSE(r.ok());
  return r.status();
}

}  // namespace

// ---- encoding ------------------------------------------------------------------------------------

TEST_CASE("KernelSpec: encode/decode round-trips every field exactly") {
  for (const KernelSpec& spec : {softmax_spec(), cpu_spec()}) {
    REQUIRE(spec.validate().ok());
    const std::string bytes = spec.encode();
    auto back = KernelSpec::decode(bytes);
    INFO(back.status().to_string());
    REQUIRE(back.ok());
    CHECK(*back == spec);
    CHECK(back->encode() == bytes);
    CHECK(back->id() == spec.id());
  }
}

TEST_CASE("KernelSpec: the encoding is a versioned array of fixed layout") {
  const std::string bytes = softmax_spec().encode();
  msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& o = oh.get();
  REQUIRE(o.type == msgpack::type::ARRAY);
  CHECK(o.via.array.size == 9);
  CHECK(o.via.array.ptr[0].as<uint32_t>() == kKernelSpecEncodingVersion);
  CHECK(o.via.array.ptr[3].as<std::string>() == softmax_spec().source);
}

TEST_CASE("KernelSpec: the encoding and id are stable across builds and hosts (golden value)") {
  // If this fails, every cached kernel just became unreachable: bump kKernelSpecEncodingVersion.
  const std::string bytes = cpu_spec().encode();
  std::string hex;
  for (unsigned char c : bytes) {
    static constexpr char kDigits[] = "0123456789abcdef";
    hex += kDigits[c >> 4];
    hex += kDigits[c & 15];
  }
  CHECK(hex ==
        "99010001bb65787465726e2022432220766f69642072756e282e2e2e29207b7d91a372756e9090909195a372756e93a131a131a131"
        "93a131a131a131a1309194000000a0");
  CHECK(cpu_spec().id().hex() == "69203fee388fc6523492d7b9e61ea437");
}

TEST_CASE("KernelSpec: id() is hash128 of the encoding and changes with any field") {
  const KernelSpec base = softmax_spec();
  CHECK(base.id() == hash128(base.encode()));
  std::vector<std::function<void(KernelSpec&)>> edits = {
      [](KernelSpec& s) { s.source += " "; },
      [](KernelSpec& s) { s.compile_options.push_back("-O3"); },
      [](KernelSpec& s) { s.compile_options = {"-DVEC=8", "--use_fast_math"}; },   // order matters
      [](KernelSpec& s) { s.plan.scratch[1].bytes = "numel0 / size0_1 * 8"; },
      [](KernelSpec& s) { s.plan.outputs[0].dtype = DType::kFloat32; },
      [](KernelSpec& s) { s.plan.launches[1].block[0] = "128"; },
      [](KernelSpec& s) { s.plan.launches[1].args[6].type = ValueType::kInt32; },
      [](KernelSpec& s) { s.plan.launches[0].shared_mem_bytes = "0"; },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    KernelSpec s = base;
    edits[i](s);
    INFO("edit " << i);
    CHECK(s.id() != base.id());
  }
}

// ---- decode: malformed input, field by field -----------------------------------------------------

TEST_CASE("KernelSpec::decode: bytes that are not one msgpack spec") {
  const std::string good = softmax_spec().encode();
  CHECK_THAT(decode_error("").message(), Catch::Contains("empty message"));
  CHECK_THAT(decode_error(good.substr(0, good.size() / 2)).message(), Catch::Contains("truncated"));
  CHECK_THAT(decode_error(good + "\x01").message(), Catch::Contains("trailing bytes"));
  CHECK_THAT(decode_error("\xc1").message(), Catch::Contains("malformed msgpack"));
  check_field(decode_error(std::string("\x93\x01\x01\x01", 4)), "kernel spec");   // 3 elements
  msgpack::sbuffer buf;
  codec::Packer pk(buf);
  pk.pack_map(0);
  check_field(decode_error(std::string(buf.data(), buf.size())), "kernel spec");
  // The same spec in a non-canonical form: the version as a 16-bit integer.
  std::string wide = good;
  wide.replace(1, 1, std::string("\xcd\x00\x01", 3));
  Status st = decode_error(wide);
  CHECK_THAT(st.message(), Catch::Contains("not in canonical encoding"));
  // Beyond the size bound, before parsing anything.
  CHECK(decode_error(std::string(5u << 20, '\0')).code() == StatusCode::kOutOfRange);
}

TEST_CASE("KernelSpec::decode: scalar fields of the wrong type or range name their field") {
  const KernelSpec s = softmax_spec();
  auto with_int = [](int64_t v) { return [v](codec::Packer& pk) { pk.pack(v); }; };
  auto with_str = [](std::string v) { return [v](codec::Packer& pk) { pk.pack(v); }; };
  Status st = decode_error(replaced(s, {0}, with_int(2)));
  check_field(st, "version");
  CHECK_THAT(st.message(), Catch::Contains("version 2 is not supported"));
  check_field(decode_error(replaced(s, {1}, with_int(7))), "backend");
  check_field(decode_error(replaced(s, {2}, with_int(-1))), "language");
  check_field(decode_error(replaced(s, {3}, with_int(5))), "source");
  check_field(decode_error(replaced(s, {4, 1}, with_int(5))), "entry_points[1]");
  check_field(decode_error(replaced(s, {5}, with_str("-O3"))), "compile_options");
  check_field(decode_error(replaced(s, {6, 0, 1}, with_int(4))), "scratch[0].bytes");
  check_field(decode_error(replaced(s, {7, 1, 0}, with_int(3))), "outputs[1].layout");
  check_field(decode_error(replaced(s, {7, 0, 1}, with_int(-1))), "outputs[0].input");
  check_field(decode_error(replaced(s, {7, 1, 2}, with_int(kDTypeCount))), "outputs[1].dtype");
  check_field(decode_error(replaced(s, {7, 1, 3, 0}, with_int(1))), "outputs[1].sizes[0]");
  check_field(decode_error(replaced(s, {8, 1, 0}, with_int(1))), "launches[1].entry");
  check_field(decode_error(replaced(s, {8, 0, 1}, with_str("1"))), "launches[0].grid");
  check_field(decode_error(replaced(s, {8, 0, 2, 2}, with_int(1))), "launches[0].block[2]");
  check_field(decode_error(replaced(s, {8, 1, 4, 2, 0}, with_int(6))), "launches[1].args[2].kind");
  check_field(decode_error(replaced(s, {8, 1, 4, 2, 1}, with_int(-1))), "launches[1].args[2].index");
  check_field(decode_error(replaced(s, {8, 1, 4, 2, 2}, with_int(6))), "launches[1].args[2].type");
  check_field(decode_error(replaced(s, {8, 1, 4, 2}, with_int(0))), "launches[1].args[2]");
}

TEST_CASE("KernelSpec::decode: lists over their limits name the list") {
  const KernelSpec s = softmax_spec();
  auto strings = [](size_t n, std::string v) {
    return [n, v](codec::Packer& pk) {
      pk.pack_array(static_cast<uint32_t>(n));
      for (size_t i = 0; i < n; ++i) pk.pack(v);
    };
  };
  Status st = decode_error(replaced(s, {4}, strings(kMaxEntryPoints + 1, "f")));
  check_field(st, "entry_points");
  CHECK_THAT(st.message(), Catch::Contains("17 elements exceed the limit of 16"));
  check_field(decode_error(replaced(s, {5}, strings(kMaxCompileOptions + 1, "-O3"))), "compile_options");
  check_field(decode_error(replaced(s, {6}, strings(kMaxScratchBuffers + 1, "x"))), "scratch");
  check_field(decode_error(replaced(s, {7}, strings(kMaxOutputs + 1, "x"))), "outputs");
  check_field(decode_error(replaced(s, {8}, strings(kMaxLaunches + 1, "x"))), "launches");
  check_field(decode_error(replaced(s, {8, 0, 4}, strings(kMaxLaunchArgs + 1, "x"))), "launches[0].args");
  check_field(decode_error(replaced(s, {7, 1, 3}, strings(kMaxTensorRank + 1, "1"))), "outputs[1].sizes");
  // Strings over their limits.
  check_field(decode_error(replaced(s, {8, 0, 1, 0}, [](codec::Packer& pk) {
                pk.pack(std::string(LaunchExpr::kMaxTextLength + 1, '1'));
              })),
              "launches[0].grid[0]");
  KernelSpec big = s;
  big.source.assign(kMaxKernelSourceBytes + 1, 'x');
  check_field(decode_error(big.encode()), "source");
}

TEST_CASE("KernelSpec::decode: a bad expression names its field and its column") {
  KernelSpec s = softmax_spec();
  s.plan.launches[0].grid[1] = "ceil_div(numel0,, 256)";
  Status st = decode_error(s.encode());
  CHECK(st.message() ==
        "launches[0].grid[1]: launch expression \"ceil_div(numel0,, 256)\": unexpected ',' at column 17\n"
        "  ceil_div(numel0,, 256)\n"
        "                  ^");
}

// ---- validate ------------------------------------------------------------------------------------

TEST_CASE("KernelSpec::validate: every expression must parse, and the error names it") {
  struct Case {
    std::function<void(KernelSpec&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](KernelSpec& s) { s.plan.scratch[1].bytes = "4 *"; }, "scratch[1].bytes"},
      {[](KernelSpec& s) { s.plan.outputs[1].sizes[0] = "(numel0"; }, "outputs[1].sizes[0]"},
      {[](KernelSpec& s) { s.plan.outputs[1].strides[0] = ""; }, "outputs[1].strides[0]"},
      {[](KernelSpec& s) { s.plan.launches[1].grid[0] = "foo(1)"; }, "launches[1].grid[0]"},
      {[](KernelSpec& s) { s.plan.launches[0].block[2] = "1 1"; }, "launches[0].block[2]"},
      {[](KernelSpec& s) { s.plan.launches[0].shared_mem_bytes = "99999999999999999999"; },
       "launches[0].shared_mem_bytes"},
      {[](KernelSpec& s) { s.plan.launches[0].args[3].expr = "size0_1 +"; }, "launches[0].args[3].expr"},
  };
  for (const Case& c : cases) {
    KernelSpec s = softmax_spec();
    c.edit(s);
    Status st = validate_error(s);
    check_field(st, c.field);
    CHECK_THAT(st.message(), Catch::Contains("launch expression"));
  }
}

TEST_CASE("KernelSpec::validate: structure, names and indices") {
  struct Case {
    std::function<void(KernelSpec&)> edit;
    std::string field;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](KernelSpec& s) { s.language = SourceLanguage::kCpp; }, "language", "cpp source cannot target the cuda backend"},
      {[](KernelSpec& s) { s.source.clear(); }, "source", "empty"},
      {[](KernelSpec& s) { s.source += std::string(1, '\0') + "x"; }, "source", "NUL byte"},
      {[](KernelSpec& s) { s.entry_points.clear(); }, "entry_points", "at least one entry point"},
      {[](KernelSpec& s) { s.entry_points[1] = "normalize<float>"; }, "entry_points[1]", "not an identifier"},
      {[](KernelSpec& s) { s.entry_points[1] = "row_stats"; }, "entry_points[1]", "duplicate of entry_points[0]"},
      {[](KernelSpec& s) { s.compile_options[0] = std::string("-D\0X", 4); }, "compile_options[0]", "NUL byte"},
      {[](KernelSpec& s) { s.plan.scratch[1].name = "row_max"; }, "scratch[1].name", "duplicate"},
      {[](KernelSpec& s) { s.plan.scratch[0].name = "2x"; }, "scratch[0].name", "not an identifier"},
      {[](KernelSpec& s) { s.plan.outputs[1].dtype.reset(); }, "outputs[1].dtype", "required"},
      {[](KernelSpec& s) { s.plan.outputs[1].input = 2; }, "outputs[1].input", "must be 0"},
      {[](KernelSpec& s) { s.plan.outputs[1].strides.push_back("1"); }, "outputs[1].strides", "2 strides for 1 sizes"},
      {[](KernelSpec& s) { s.plan.outputs[0].sizes = {"1"}; }, "outputs[0]", "no sizes or strides"},
      {[](KernelSpec& s) { s.plan.outputs[0].input = 64; }, "outputs[0].input", "beyond"},
      {[](KernelSpec& s) { s.plan.launches.clear(); }, "launches", "at least one launch"},
      {[](KernelSpec& s) { s.plan.launches[1].entry = "softmax"; }, "launches[1].entry", "not one of the entry points"},
      {[](KernelSpec& s) { s.plan.launches[1].args[2] = ArgBinding::output(2); }, "launches[1].args[2].index",
       "output 2 does not exist"},
      {[](KernelSpec& s) { s.plan.launches[1].args[3] = ArgBinding::scratch(5); }, "launches[1].args[3].index",
       "scratch buffer 5 does not exist"},
      {[](KernelSpec& s) { s.plan.launches[1].args[0] = ArgBinding::input(64); }, "launches[1].args[0].index",
       "beyond"},
      {[](KernelSpec& s) { s.plan.launches[1].args[0].type = ValueType::kInt32; }, "launches[1].args[0].type",
       "passed as a pointer"},
      {[](KernelSpec& s) { s.plan.launches[1].args[0].expr = "1"; }, "launches[1].args[0].expr",
       "only a size binding"},
      {[](KernelSpec& s) { s.plan.launches[1].args[5].type = ValueType::kFloat32; }, "launches[1].args[5].type",
       "int64 or int32"},
      {[](KernelSpec& s) { s.plan.launches[1].args[5].index = 1; }, "launches[1].args[5].index", "must be 0"},
      {[](KernelSpec& s) { s.plan.launches[1].args[6].type = ValueType::kPointer; }, "launches[1].args[6].type",
       "by value"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    KernelSpec s = softmax_spec();
    cases[i].edit(s);
    INFO("case " << i);
    Status st = validate_error(s);
    check_field(st, cases[i].field);
    CHECK_THAT(st.message(), Catch::Contains(cases[i].says));
  }
  KernelSpec many = softmax_spec();
  many.plan.launches[0].args.assign(kMaxLaunchArgs + 1, ArgBinding::input(0));
  check_field(validate_error(many), "launches[0].args");
}

// ---- resolve -------------------------------------------------------------------------------------

TEST_CASE("KernelSpec::resolve: a softmax plan becomes concrete launch numbers") {
  const OpSignature sig = softmax_signature();
  auto r = softmax_spec().resolve(sig);
  INFO(r.status().to_string());
  REQUIRE(r.ok());
  const int64_t rows = 4096, cols = 50257;

  REQUIRE(r->scratch.size() == 2);
  CHECK(r->scratch[0].bytes == rows * 4);
  CHECK(r->scratch[1].bytes == rows * 4);

  REQUIRE(r->outputs.size() == 2);
  // empty_like(self): same dtype, sizes and (dense) strides as the input.
  CHECK(r->outputs[0] == ResolvedOutput{DType::kBFloat16, {rows, cols}, {cols, 1}, rows * cols * 2});
  CHECK(r->outputs[1] == ResolvedOutput{DType::kFloat32, {rows}, {1}, rows * 4});

  REQUIRE(r->launches.size() == 2);
  const ResolvedLaunch& stats = r->launches[0];
  CHECK(stats.entry_index == 0);
  CHECK(stats.grid == std::array<uint32_t, 3>{4096, 1, 1});
  CHECK(stats.block == std::array<uint32_t, 3>{1024, 1, 1});   // min(1024, round_up(6283, 32))
  CHECK(stats.shared_mem_bytes == 32 * 8);
  REQUIRE(stats.args.size() == 5);
  CHECK(stats.args[0] == ResolvedArg{ArgBinding::Kind::kInput, ValueType::kPointer, 0, 0, 0});
  CHECK(stats.args[1] == ResolvedArg{ArgBinding::Kind::kScratch, ValueType::kPointer, 0, 0, 0});
  CHECK(stats.args[2] == ResolvedArg{ArgBinding::Kind::kScratch, ValueType::kPointer, 1, 0, 0});
  CHECK(stats.args[3] == ResolvedArg{ArgBinding::Kind::kSize, ValueType::kInt32, 0, cols, 0});
  CHECK(stats.args[4] == ResolvedArg{ArgBinding::Kind::kSize, ValueType::kInt64, 0, cols, 0});

  const ResolvedLaunch& norm = r->launches[1];
  CHECK(norm.entry_index == 1);
  CHECK(norm.grid == std::array<uint32_t, 3>{25, 4096, 1});
  CHECK(norm.block == std::array<uint32_t, 3>{256, 1, 1});
  CHECK(norm.shared_mem_bytes == 0);
  REQUIRE(norm.args.size() == 9);
  CHECK(norm.args[1] == ResolvedArg{ArgBinding::Kind::kOutput, ValueType::kPointer, 0, 0, 0});
  CHECK(norm.args[2] == ResolvedArg{ArgBinding::Kind::kOutput, ValueType::kPointer, 1, 0, 0});
  CHECK(norm.args[6] == ResolvedArg{ArgBinding::Kind::kScalar, ValueType::kInt64, 0, -1, 0});
  CHECK(norm.args[7] == ResolvedArg{ArgBinding::Kind::kScalar, ValueType::kBool, 0, 0, 0});
  CHECK(norm.args[8] == ResolvedArg{ArgBinding::Kind::kScalar, ValueType::kFloat32, 0, 0, -1.0});
}

TEST_CASE("KernelSpec::resolve: launch dimensions outside the hardware limits name the field") {
  auto with = [](std::function<void(Launch&)> edit) {
    KernelSpec s = softmax_spec();
    edit(s.plan.launches[1]);
    return s;
  };
  Status st = resolve_error(with([](Launch& l) { l.grid[0] = "0"; }));
  CHECK(st.code() == StatusCode::kOutOfRange);
  check_field(st, "launches[1].grid[0]");
  CHECK_THAT(st.message(), Catch::Contains("\"0\" = 0 is outside [1, 2147483647]"));
  check_field(resolve_error(with([](Launch& l) { l.grid[0] = "2147483648"; })), "launches[1].grid[0]");
  check_field(resolve_error(with([](Launch& l) { l.grid[1] = "65536"; })), "launches[1].grid[1]");
  check_field(resolve_error(with([](Launch& l) { l.grid[2] = "numel0"; })), "launches[1].grid[2]");
  check_field(resolve_error(with([](Launch& l) { l.block[0] = "1025"; })), "launches[1].block[0]");
  check_field(resolve_error(with([](Launch& l) { l.block[2] = "65"; })), "launches[1].block[2]");
  st = resolve_error(with([](Launch& l) { l.block = {"32", "16", "4"}; }));
  check_field(st, "launches[1].block");
  CHECK_THAT(st.message(), Catch::Contains("32 x 16 x 4 = 2048 threads exceed the limit of 1024"));
  check_field(resolve_error(with([](Launch& l) { l.shared_mem_bytes = "-4"; })), "launches[1].shared_mem_bytes");
  // The largest legal values pass.
  auto ok = with([](Launch& l) {
    l.grid = {"2147483647", "65535", "65535"};
    l.block = {"1", "16", "64"};
    l.shared_mem_bytes = "2147483647";
  }).resolve(softmax_signature());
  INFO(ok.status().to_string());
  CHECK(ok.ok());
}

TEST_CASE("KernelSpec::resolve: evaluation errors keep their code and gain the field") {
  KernelSpec s = softmax_spec();
  s.plan.launches[0].grid[0] = "numel1 / size0_1";
  Status st = resolve_error(s);
  CHECK(st.code() == StatusCode::kNotFound);
  check_field(st, "launches[0].grid[0]");
  CHECK_THAT(st.message(), Catch::Contains("unknown size 'numel1'"));

  s = softmax_spec();
  s.plan.scratch[0].bytes = "numel0 / (arg2)";   // half_to_float is false: 0
  st = resolve_error(s);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  check_field(st, "scratch[0].bytes");
  CHECK_THAT(st.message(), Catch::Contains("division by zero"));
}

TEST_CASE("KernelSpec::resolve: sizes, scratch and int32 arguments are range-checked") {
  KernelSpec s = softmax_spec();
  s.plan.scratch[1].bytes = "numel0 * 8192";   // 1.7e12 > 2^40
  check_field(resolve_error(s), "scratch[1].bytes");
  s = softmax_spec();
  s.plan.scratch[1].bytes = "0 - 1";
  check_field(resolve_error(s), "scratch[1].bytes");
  s = softmax_spec();
  s.plan.outputs[1].sizes[0] = "arg1";
  check_field(resolve_error(s), "outputs[1].sizes[0]");
  s = softmax_spec();
  s.plan.outputs[1].strides[0] = "-1";
  check_field(resolve_error(s), "outputs[1].strides[0]");
  s = softmax_spec();
  s.plan.outputs[1].sizes[0] = "4611686018427387904";
  s.plan.outputs[1].strides[0] = "4";
  Status st = resolve_error(s);
  check_field(st, "outputs[1]");
  CHECK_THAT(st.message(), Catch::Contains("storage size overflows int64"));
  s = softmax_spec();
  s.plan.launches[0].args[3].expr = "numel0 * 16";   // 3.3e9 does not fit int32
  st = resolve_error(s);
  CHECK(st.code() == StatusCode::kOutOfRange);
  check_field(st, "launches[0].args[3].expr");
  s.plan.launches[0].args[3].type = ValueType::kInt64;
  CHECK(s.resolve(softmax_signature()).ok());
}

TEST_CASE("KernelSpec::resolve: bindings must match the kinds of the signature's arguments") {
  KernelSpec s = softmax_spec();
  s.plan.launches[1].args[0] = ArgBinding::input(1);
  Status st = resolve_error(s);
  check_field(st, "launches[1].args[0]");
  CHECK_THAT(st.message(), Catch::Contains("argument 1 of aten::_softmax is an int, not a tensor"));
  s = softmax_spec();
  s.plan.launches[1].args[6] = ArgBinding::scalar(0, ValueType::kInt64);
  CHECK_THAT(resolve_error(s).message(), Catch::Contains("argument 0 of aten::_softmax is a tensor, not a scalar"));
  s = softmax_spec();
  s.plan.launches[1].args[6] = ArgBinding::scalar(3, ValueType::kInt64);
  check_field(resolve_error(s), "launches[1].args[6]");
  s = softmax_spec();
  s.plan.outputs[0] = OutputSpec::like(2);
  check_field(resolve_error(s), "outputs[0].input");
  // A CUDA plan does not run a CPU signature.
  OpSignature cpu = softmax_signature();
  cpu.target = Target{Backend::kCpu, "x86_64"};
  check_field(resolve_error(softmax_spec(), cpu), "backend");
}

TEST_CASE("KernelSpec::resolve: scalars convert to the parameter type, exactly or not at all") {
  OpSignature sig{"aten::test", "",
                  {Arg::real(0.5), Arg::real(3.0), Arg::integer(3000000000), Arg::boolean(true), Arg::real(1e300),
                   Arg::none(), Arg::real(std::numeric_limits<double>::infinity())},
                  Target{Backend::kCpu, "x86_64"}};
  auto resolve_one = [&](ArgBinding b) -> StatusOr<ResolvedArg> {
    KernelSpec s = cpu_spec();
    s.plan.launches[0].args = {b};
    auto r = s.resolve(sig);
    if (!r.ok()) return r.status();
    return r->launches[0].args[0];
  };
  CHECK(resolve_one(ArgBinding::scalar(0, ValueType::kFloat64))->real_value == 0.5);
  CHECK(resolve_one(ArgBinding::scalar(0, ValueType::kFloat32))->real_value == 0.5);
  CHECK(resolve_one(ArgBinding::scalar(0, ValueType::kBool))->int_value == 1);
  CHECK(resolve_one(ArgBinding::scalar(1, ValueType::kInt32))->int_value == 3);
  CHECK(resolve_one(ArgBinding::scalar(2, ValueType::kInt64))->int_value == 3000000000);
  CHECK(resolve_one(ArgBinding::scalar(2, ValueType::kFloat64))->real_value == 3e9);
  CHECK(resolve_one(ArgBinding::scalar(3, ValueType::kFloat32))->real_value == 1.0);
  CHECK(resolve_one(ArgBinding::scalar(3, ValueType::kInt32))->int_value == 1);
  CHECK(std::isinf(resolve_one(ArgBinding::scalar(6, ValueType::kFloat32))->real_value));
  // A float32 parameter gets the float32-rounded value.
  sig.args[0] = Arg::real(0.1);
  CHECK(resolve_one(ArgBinding::scalar(0, ValueType::kFloat32))->real_value == static_cast<double>(0.1f));
  // Refusals: an inexact integer, an int32 overflow, a finite double beyond float32, None.
  CHECK_THAT(resolve_one(ArgBinding::scalar(0, ValueType::kInt64)).status().message(),
             Catch::Contains("is not an integer"));
  CHECK_THAT(resolve_one(ArgBinding::scalar(2, ValueType::kInt32)).status().message(),
             Catch::Contains("does not fit int32"));
  CHECK_THAT(resolve_one(ArgBinding::scalar(4, ValueType::kFloat32)).status().message(),
             Catch::Contains("does not fit float32"));
  CHECK_THAT(resolve_one(ArgBinding::scalar(5, ValueType::kFloat64)).status().message(),
             Catch::Contains("is None, not a scalar"));
}

TEST_CASE("KernelSpec::resolve: a CUDA kernel reads a CPU tensor of its call only as a value") {
  // mul.Tensor(x, 0.5) on a GPU: the Python number is a 0-dimensional float64 CPU tensor.
  TensorMeta half = tensor(DType::kFloat64, {});
  half.device = DeviceType::kCpu;
  const OpSignature sig{"aten::mul", "Tensor", {Arg::tensor(tensor(DType::kFloat16, {8})), Arg::tensor(half)},
                        Target{Backend::kCuda, "sm_90"}};
  KernelSpec s;
  s.backend = Backend::kCuda;
  s.language = SourceLanguage::kCuda;
  s.source = "extern \"C\" __global__ void k(...) {}\n";
  s.entry_points = {"k"};
  s.plan.outputs = {OutputSpec::like(0)};
  Launch l;
  l.entry = "k";
  l.args = {ArgBinding::input(0), ArgBinding::output(0), ArgBinding::tensor_value(1, ValueType::kFloat32)};
  s.plan.launches = {l};
  CHECK(s.resolve(sig).ok());
  s.plan.launches[0].args[2] = ArgBinding::input(1);   // its host address handed to the kernel
  CHECK_THAT(s.resolve(sig).status().message(),
             Catch::Contains("input 1 of aten::mul is a CPU tensor: a CUDA kernel reads it only as a value"));
}

TEST_CASE("KernelSpec::resolve: a value binding takes a one-element CPU tensor, and the launch reads it") {
  auto cpu_tensor = [](DType dt, std::vector<int64_t> sizes) {
    TensorMeta t = tensor(dt, std::move(sizes));
    t.device = DeviceType::kCpu;
    return t;
  };
  OpSignature sig{"aten::mul", "Tensor",
                  {Arg::tensor(tensor(DType::kFloat32, {8})), Arg::tensor(cpu_tensor(DType::kFloat64, {})),
                   Arg::tensor(cpu_tensor(DType::kInt64, {})), Arg::tensor(cpu_tensor(DType::kFloat32, {2})),
                   Arg::tensor(cpu_tensor(DType::kComplex64, {})), Arg::real(2.0)},
                  Target{Backend::kCpu, "x86_64"}};
  auto resolve_one = [&](ArgBinding b) -> StatusOr<ResolvedLaunch> {
    KernelSpec s = cpu_spec();
    s.plan.launches[0].args = {b};
    auto r = s.resolve(sig);
    if (!r.ok()) return r.status();
    return r->launches[0];
  };
  StatusOr<ResolvedLaunch> f = resolve_one(ArgBinding::tensor_value(1, ValueType::kFloat32));
  REQUIRE(f.ok());
  CHECK(f->args[0].kind == ArgBinding::Kind::kTensorValue);
  CHECK(f->args[0].index == 1);
  CHECK(f->args[0].int_value == static_cast<int64_t>(DType::kFloat64));
  // Refusals, each naming what the argument is: a CUDA tensor, more than one element, an
  // unreadable dtype, a scalar argument, and a value passed as a pointer (validate()).
  sig.args[0] = Arg::tensor(tensor(DType::kFloat32, {}));
  CHECK_THAT(resolve_one(ArgBinding::tensor_value(0, ValueType::kFloat32)).status().message(),
             Catch::Contains("not a one-element CPU tensor"));
  CHECK_THAT(resolve_one(ArgBinding::tensor_value(3, ValueType::kFloat32)).status().message(),
             Catch::Contains("not a one-element CPU tensor"));
  CHECK_THAT(resolve_one(ArgBinding::tensor_value(4, ValueType::kFloat32)).status().message(),
             Catch::Contains("has dtype complex64"));
  CHECK_THAT(resolve_one(ArgBinding::tensor_value(5, ValueType::kFloat32)).status().message(),
             Catch::Contains("not a tensor"));
  KernelSpec bad = cpu_spec();
  bad.plan.launches[0].args = {ArgBinding::tensor_value(1, ValueType::kPointer)};
  CHECK_THAT(bad.validate().message(), Catch::Contains("passed by value"));

  // The launch converts the element it is pointed at, read at each call.
  auto bind = [](const ResolvedLaunch& l, const void* host, ParamSlot& slot) {
    void* param = nullptr;
    return bind_launch_args(
        l, std::span<ParamSlot>(&slot, 1), std::span<void*>(&param, 1),
        [&](ArgBinding::Kind, uint32_t) -> uint64_t { return reinterpret_cast<uintptr_t>(host); },
        [] { return std::string("launch 0"); }, [](uint32_t) { return false; },
        [](ArgBinding::Kind) { return "no tensor for input"; });
  };
  ParamSlot slot{};
  double half = 0.5, third = 1.0 / 3;
  REQUIRE(bind(*f, &half, slot).ok());
  CHECK(slot.f32 == 0.5f);
  REQUIRE(bind(*f, &third, slot).ok());
  CHECK(slot.f32 == static_cast<float>(1.0 / 3));
  StatusOr<ResolvedLaunch> i = resolve_one(ArgBinding::tensor_value(2, ValueType::kInt32));
  REQUIRE(i.ok());
  int64_t seven = 7, big = int64_t{1} << 40;
  REQUIRE(bind(*i, &seven, slot).ok());
  CHECK(slot.i32 == 7);
  CHECK_THAT(bind(*i, &big, slot).message(), Catch::Contains("does not fit int32"));
  StatusOr<ResolvedLaunch> d = resolve_one(ArgBinding::tensor_value(1, ValueType::kInt64));
  REQUIRE(d.ok());
  CHECK_THAT(bind(*d, &half, slot).message(), Catch::Contains("is not an integer"));
  CHECK_THAT(bind(*f, nullptr, slot).message(), Catch::Contains("no tensor for input 1"));
}

TEST_CASE("KernelSpec::resolve: an output like an input follows torch.empty_like's strides") {
  auto like_strides = [](TensorMeta t) {
    OpSignature sig{"aten::test", "", {Arg::tensor(std::move(t))}, Target{Backend::kCpu, "x86_64"}};
    KernelSpec s = cpu_spec();
    s.plan.outputs = {OutputSpec::like(0, DType::kFloat32)};
    auto r = s.resolve(sig);
    REQUIRE(r.ok());
    REQUIRE(r->outputs[0].dtype == DType::kFloat32);   // the dtype override
    return r->outputs[0];
  };
  // Dense layouts are kept as they are: contiguous, channels-last, transposed.
  CHECK(like_strides(tensor(DType::kFloat16, {8, 3, 224, 224})).strides ==
        std::vector<int64_t>{150528, 50176, 224, 1});
  CHECK(like_strides(tensor(DType::kFloat16, {8, 3, 224, 224}, {150528, 1, 672, 3})).strides ==
        std::vector<int64_t>{150528, 1, 672, 3});
  CHECK(like_strides(tensor(DType::kFloat32, {5, 7}, {1, 5})).strides == std::vector<int64_t>{1, 5});
  // Size-1 dimensions may have any stride and still be dense.
  CHECK(like_strides(tensor(DType::kFloat32, {4, 1, 3}, {3, 99, 1})).strides == std::vector<int64_t>{3, 99, 1});
  // Gaps: dense strides in the input's stride order (a column slice of a transposed matrix).
  CHECK(like_strides(tensor(DType::kFloat32, {4, 3}, {1, 8})).strides == std::vector<int64_t>{1, 4});
  CHECK(like_strides(tensor(DType::kFloat32, {2, 3, 4}, {24, 8, 2})).strides == std::vector<int64_t>{12, 4, 1});
  // Broadcast (stride 0) dimensions keep their place: contiguous here.
  CHECK(like_strides(tensor(DType::kFloat32, {4, 3}, {0, 1})).strides == std::vector<int64_t>{3, 1});
  // ATen's worked example: sizes (6,5,4,3,2), strides (6,0,120,0,1) -> order (4,3,0,1,2).
  CHECK(like_strides(tensor(DType::kFloat32, {6, 5, 4, 3, 2}, {6, 0, 120, 0, 1})).strides ==
        std::vector<int64_t>{6, 36, 180, 2, 1});
  // One dimension with a gap becomes stride 1; a 0-d tensor holds one element.
  CHECK(like_strides(tensor(DType::kFloat32, {5}, {2})).strides == std::vector<int64_t>{1});
  ResolvedOutput scalar = like_strides(tensor(DType::kFloat32, {}));
  CHECK(scalar.sizes.empty());
  CHECK(scalar.storage_bytes == 4);
  // An empty tensor needs no storage.
  CHECK(like_strides(tensor(DType::kFloat32, {0, 3})).storage_bytes == 0);
}

TEST_CASE("KernelSpec: an output written in place is its argument, layout and all, and round-trips") {
  KernelSpec s = cpu_spec();
  s.plan.outputs = {OutputSpec::in_place(0)};
  REQUIRE(s.validate().ok());
  StatusOr<KernelSpec> back = KernelSpec::decode(s.encode());
  REQUIRE(back.ok());
  CHECK(*back == s);
  CHECK(back->plan.outputs[0].layout == OutputSpec::Layout::kInPlace);
  // The argument's own strides, gaps included (nothing is allocated, so nothing is made dense).
  OpSignature sig{"aten::relu_", "", {Arg::tensor(tensor(DType::kBFloat16, {4, 3}, {8, 2}))},
                  Target{Backend::kCpu, "x86_64"}};
  auto r = s.resolve(sig);
  REQUIRE(r.ok());
  CHECK(r->outputs[0].in_place_of == 0);
  CHECK(r->outputs[0].dtype == DType::kBFloat16);
  CHECK(r->outputs[0].strides == std::vector<int64_t>{8, 2});
  // An allocated output says so.
  s.plan.outputs = {OutputSpec::like(0)};
  CHECK(s.resolve(sig)->outputs[0].in_place_of == -1);
  // What cannot be written in place names its field.
  s.plan.outputs = {OutputSpec::in_place(0), OutputSpec::in_place(0)};
  check_field(s.validate(), "outputs[1].input");
  s.plan.outputs = {OutputSpec::in_place(0)};
  s.plan.outputs[0].dtype = DType::kFloat32;
  check_field(s.validate(), "outputs[0].dtype");
  s.plan.outputs = {OutputSpec::in_place(1)};
  OpSignature scalar{"aten::test", "", {Arg::tensor(tensor(DType::kFloat32, {4})), Arg::real(0.5)},
                     Target{Backend::kCpu, "x86_64"}};
  CHECK_THAT(s.resolve(scalar).status().message(), Catch::Contains("not a tensor"));
}
