// OpSignature: the key of every cache entry and report. These tests pin down the promises the rest
// of kforge relies on: one signature has one encoding and one id on every host, every field that
// changes what a kernel must do changes the id, and decoding rejects everything else with a reason.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "runtime/op_signature.h"

using namespace kforge;

namespace {

TensorMeta contiguous(DType dt, std::vector<int64_t> sizes, DeviceType dev = DeviceType::kCuda) {
  return contiguous_tensor(dt, dev, std::move(sizes));
}

OpSignature softmax(int64_t dim) {
  return OpSignature{"aten::_softmax", "",
                     {Arg::tensor(contiguous(DType::kBFloat16, {4096, 50257})), Arg::integer(dim),
                      Arg::boolean(false)},
                     Target{Backend::kCuda, "sm_90"}};
}

OpSignature every_kind() {
  TensorMeta strided = contiguous(DType::kFloat16, {8, 3, 224, 224});
  strided.strides = {150528, 1, 672, 3};  // channels-last
  strided.alignment = 8;
  return OpSignature{"aten::test_op", "overload",
                     {Arg::none(), Arg::tensor(strided),
                      Arg::tensor_list({contiguous(DType::kFloat32, {2}), contiguous(DType::kInt64, {})}),
                      Arg::boolean(true), Arg::integer(std::numeric_limits<int64_t>::min()), Arg::real(-0.5),
                      Arg::string("tanh"), Arg::int_list({-1, 0, 1 << 20})},
                     Target{Backend::kCpu, "x86_64-avx2"}};
}

}  // namespace

TEST_CASE("OpSignature: encode/decode round-trips every argument kind exactly") {
  OpSignature s = every_kind();
  std::string bytes = s.encode();
  auto back = OpSignature::decode(bytes);
  REQUIRE(back.ok());
  CHECK(*back == s);
  CHECK(back->encode() == bytes);
  CHECK(back->id() == s.id());
}

TEST_CASE("OpSignature: the id is stable across builds and hosts (golden value)") {
  // If this fails, every cache on every host just became a miss: bump the encoding version.
  // The golden values come from an independent implementation (Python msgpack + xxhash):
  //   xxh3_128_hexdigest(packb([1, 'aten::_softmax', '', [[1, 3, 1, [4096, 50257], [50257, 1], 16],
  //                                [4, -1], [3, False]], [1, 'sm_90']]))
  OpSignature s = softmax(-1);
  CHECK(s.encode().size() == 50);
  CHECK(s.id().hex() == "51be95bf0e09528be9444ef1107ce611");
}

TEST_CASE("OpSignature: scalar arguments are part of the key") {
  CHECK(softmax(-1).id() != softmax(0).id());
  CHECK(softmax(-1).id() != softmax(1).id());
  OpSignature a = softmax(-1), b = softmax(-1);
  b.args[2] = Arg::boolean(true);
  CHECK(a.id() != b.id());
  // An int 1 and a float 1.0 are different arguments.
  b = softmax(-1);
  b.args[1] = Arg::real(-1.0);
  CHECK(a.id() != b.id());
}

TEST_CASE("OpSignature: every tensor property and the target change the key") {
  const SignatureId base = softmax(-1).id();
  auto variant = [](auto mutate) {
    OpSignature s = softmax(-1);
    mutate(s, std::get<TensorMeta>(s.args[0].value));
    return s.id();
  };
  CHECK(variant([](OpSignature&, TensorMeta& t) { t.dtype = DType::kFloat16; }) != base);
  CHECK(variant([](OpSignature&, TensorMeta& t) { t.sizes[0] = 4095; }) != base);
  CHECK(variant([](OpSignature&, TensorMeta& t) { t.strides[0] = 50258; }) != base);
  CHECK(variant([](OpSignature&, TensorMeta& t) { t.alignment = 2; }) != base);
  CHECK(variant([](OpSignature&, TensorMeta& t) { t.device = DeviceType::kCpu; }) != base);
  CHECK(variant([](OpSignature& s, TensorMeta&) { s.target.arch = "sm_100"; }) != base);
  CHECK(variant([](OpSignature& s, TensorMeta&) { s.target.backend = Backend::kCpu; }) != base);
  CHECK(variant([](OpSignature& s, TensorMeta&) { s.overload = "out"; }) != base);
}

TEST_CASE("OpSignature: all NaNs are one key, -0.0 and 0.0 are two") {
  OpSignature a = every_kind(), b = every_kind();
  a.args[5] = Arg::real(std::numeric_limits<double>::quiet_NaN());
  b.args[5] = Arg::real(-std::numeric_limits<double>::signaling_NaN());
  CHECK(a == b);
  CHECK(a.encode() == b.encode());
  a.args[5] = Arg::real(0.0);
  b.args[5] = Arg::real(-0.0);
  CHECK_FALSE(a == b);
  CHECK(a.id() != b.id());
}

TEST_CASE("OpSignature: decode rejects malformed bytes with a reason naming the field") {
  const std::string good = softmax(-1).encode();
  SECTION("every truncation fails cleanly") {
    for (size_t n = 0; n < good.size(); ++n) {
      auto r = OpSignature::decode(std::string_view(good).substr(0, n));
      CHECK_FALSE(r.ok());
    }
  }
  SECTION("trailing bytes") {
    auto r = OpSignature::decode(good + '\0');
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("trailing"));
  }
  SECTION("a size that is not an integer") {
    OpSignature s = softmax(-1);
    std::string bytes = s.encode();
    // sizes [4096, 50257] are packed as uint16 (0xcd 0x10 0x00) and uint32; replace 4096's type
    // byte with a fixstr of length 2 reading the next two bytes.
    size_t pos = bytes.find(std::string("\xcd\x10\x00", 3));
    REQUIRE(pos != std::string::npos);
    bytes[pos] = '\xa2';
    auto r = OpSignature::decode(bytes);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("signature.args[0].sizes[0]: expected integer, got string"));
  }
  SECTION("an alignment above the cap (one shape must not split by allocator luck)") {
    OpSignature s = softmax(-1);
    std::get<TensorMeta>(s.args[0].value).alignment = 256;
    auto r = OpSignature::decode(s.encode());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("signature.args[0].alignment: value 256 outside [1, 16]"));
  }
  SECTION("an unknown dtype") {
    OpSignature s = softmax(-1);
    std::string bytes = s.encode();
    // [1, dtype=3 (bf16), device=1, ...]: the tensor arg opens with 0x96 0x01 0x03 0x01.
    size_t pos = bytes.find(std::string("\x96\x01\x03\x01", 4));
    REQUIRE(pos != std::string::npos);
    bytes[pos + 2] = 0x7f;
    auto r = OpSignature::decode(bytes);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("signature.args[0].dtype: value 127 outside [0, 13]"));
  }
  SECTION("a rank over the limit") {
    OpSignature s = softmax(-1);
    auto& t = std::get<TensorMeta>(s.args[0].value);
    t.sizes.assign(kMaxTensorRank + 1, 1);
    t.strides.assign(kMaxTensorRank + 1, 1);
    auto r = OpSignature::decode(s.encode());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("exceeds 16"));
  }
  SECTION("a non-canonical but well-formed encoding (an int packed wider than needed)") {
    std::string bytes = good;
    // dim=-1 is the negative fixint 0xff right after the int-kind marker [4, -1] = 0x92 0x04 0xff.
    size_t pos = bytes.find(std::string("\x92\x04\xff", 3));
    REQUIRE(pos != std::string::npos);
    bytes.replace(pos + 2, 1, std::string("\xd0\xff", 2));  // int8 -1
    auto r = OpSignature::decode(bytes);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("canonical"));
  }
  SECTION("a tensor whose element count overflows int64 (found by fuzz_wire)") {
    OpSignature s = softmax(-1);
    auto& t = std::get<TensorMeta>(s.args[0].value);
    t.sizes = {int64_t{1} << 62, 4};
    t.strides = {4, 1};
    CHECK_FALSE(t.is_contiguous());  // no signed overflow on the way (UBSan checks this)
    auto r = OpSignature::decode(s.encode());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("element count overflows int64"));
  }
  SECTION("a declared array length far beyond the bytes present does not allocate it") {
    std::string bytes = "\xdd\xff\xff\xff\xff";  // array32 of 4 billion elements, no elements
    auto r = OpSignature::decode(bytes);
    CHECK_FALSE(r.ok());
  }
}

TEST_CASE("OpSignature: named sizes are what launch plans are written against") {
  OpSignature s = every_kind();
  auto m = s.named_sizes();
  CHECK(m.at("ndim1") == 4);
  CHECK(m.at("numel1") == 8 * 3 * 224 * 224);
  CHECK(m.at("size1_2") == 224);
  CHECK(m.at("stride1_1") == 1);
  CHECK(m.at("arg3") == 1);  // bool true
  CHECK(m.at("arg4") == std::numeric_limits<int64_t>::min());
  CHECK(m.at("len7") == 3);
  CHECK(m.at("arg7_2") == (1 << 20));
  CHECK(m.count("arg5") == 0);  // floats are not sizes
}

TEST_CASE("OpSignature: to_string is readable and marks non-contiguous layouts") {
  CHECK(softmax(-1).to_string() == "aten::_softmax(bfloat16[4096,50257], -1, false) cuda:sm_90");
  CHECK_THAT(every_kind().to_string(), Catch::Contains("float16[8,3,224,224]{strides=150528,1,672,3}{align=8}"));
}

TEST_CASE("SignatureId: hex round-trips and rejects bad text") {
  SignatureId id = softmax(-1).id();
  auto back = SignatureId::from_hex(id.hex());
  REQUIRE(back.ok());
  CHECK(*back == id);
  CHECK_FALSE(SignatureId::from_hex("abc").ok());
  auto bad = SignatureId::from_hex(std::string(31, '0') + "g");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("position 32"));
}
