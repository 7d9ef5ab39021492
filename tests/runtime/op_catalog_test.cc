// The operator catalog (runtime/op_catalog.h): the one place an operator is declared. These cases
// walk every entry and fail on any that is incomplete, so an operator cannot be half-added; and
// they pin the output rules and the cost model the daemon's roofline and the worker's bandwidth
// numbers rest on.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "runtime/op_catalog.h"

using namespace kforge;

namespace {

TensorMeta tensor(std::vector<int64_t> sizes, DType dtype = DType::kFloat32) {
  return contiguous_tensor(dtype, DeviceType::kCpu, std::move(sizes));
}

}  // namespace

TEST_CASE("catalog: every entry is complete, and the hook's list names exactly the entries, in order") {
  const std::span<const catalog::OpEntry> ops = catalog::operators();
  REQUIRE(ops.size() == catalog::kOperatorCount);
  std::vector<std::string> listed;
#define LISTED_OP(base) listed.push_back("aten::" #base);
#define LISTED_OP_OVERLOAD(base, overload) listed.push_back("aten::" #base "." #overload);
  KFORGE_CATALOG_OPERATORS(LISTED_OP, LISTED_OP_OVERLOAD)
#undef LISTED_OP
#undef LISTED_OP_OVERLOAD
  REQUIRE(listed.size() == ops.size());
  std::set<std::string> names;
  for (size_t i = 0; i < ops.size(); ++i) {
    const catalog::OpEntry& e = ops[i];
    INFO(e.qualified());
    CHECK(catalog::incomplete(e).empty());
    CHECK(listed[i] == e.qualified());
    CHECK(names.insert(e.qualified()).second);   // declared once
    CHECK(catalog::find(e.name, e.overload) == &e);
    CHECK(catalog::index_of(e) == i);
  }
  CHECK(catalog::find("aten::add", "Scalar") == nullptr);
  CHECK(catalog::find("aten::mm", "") == nullptr);
}

TEST_CASE("catalog: an incomplete entry is named with what is missing") {
  const catalog::OpEntry& softmax = *catalog::find("aten::_softmax", "");
  catalog::OpEntry e = softmax;
  e.flops_per_element = 0;
  CHECK(catalog::incomplete(e) == "aten::_softmax: no FLOPs per element (Note [Op cost model])");
  e = softmax;
  e.args = e.args.subspan(0, 2);
  CHECK(catalog::incomplete(e) == "aten::_softmax: 2 arguments declared, the schema has 3");
  e = softmax;
  e.template_families = {};
  CHECK(catalog::incomplete(e) == "aten::_softmax: no template family, and no reason why there is none");
  e.no_templates_reason = "a compiler front end serves it";
  CHECK(catalog::incomplete(e).empty());
  e = softmax;
  e.semantics = "Softmax.";
  CHECK(catalog::incomplete(e).find("must say what each output is") != std::string::npos);
  e = softmax;
  e.schema = "aten::_softmax.out(Tensor self) -> Tensor";
  CHECK(catalog::incomplete(e) == "aten::_softmax: the schema must start with aten::_softmax(");
  static const catalog::ArgDecl bad_index[] = {{"self", catalog::ArgRole::kData, catalog::InputRange::kIndex},
                                               {"dim", catalog::ArgRole::kDim},
                                               {"half_to_float", catalog::ArgRole::kResultType}};
  e = softmax;
  e.args = bad_index;
  CHECK(catalog::incomplete(e) == "aten::_softmax: argument 0 is an index without the dimension that bounds it");
}

TEST_CASE("catalog: the arguments say what the float64 reference and the trial data need") {
  const catalog::OpEntry& softmax = *catalog::find("aten::_softmax", "");
  CHECK(softmax.args[2].role == catalog::ArgRole::kResultType);   // half_to_float: off for the reference
  const catalog::OpEntry& ln = *catalog::find("aten::native_layer_norm", "");
  CHECK(ln.args[2].role == catalog::ArgRole::kParameter);
  CHECK(ln.outputs.size() == 3);
  CHECK(catalog::find("aten::add", "Tensor")->inplace == "aten::add_.Tensor");
  CHECK(catalog::find("aten::gelu", "")->out_variant == "aten::gelu.out");
  CHECK(catalog::arg_role_name(catalog::ArgRole::kResultType) == "result_type");
  CHECK(catalog::input_range_name(catalog::InputRange::kProbability) == "probability");
}

TEST_CASE("catalog: every out variant the hook intercepts is an entry's, and every entry's is intercepted but one") {
  std::vector<std::string> listed;
#define KFORGE_TEST_OUT(base, overload) listed.push_back("aten::" #base "." #overload);
  KFORGE_CATALOG_OUT_VARIANTS(KFORGE_TEST_OUT)
#undef KFORGE_TEST_OUT
  for (const std::string& v : listed) {
    CAPTURE(v);
    CHECK(catalog::out_variant_intercepted(v));
    size_t owners = 0;
    for (const catalog::OpEntry& e : catalog::operators()) owners += e.out_variant == v ? 1 : 0;
    CHECK(owners == 1);
  }
  size_t not_intercepted = 0;
  for (const catalog::OpEntry& e : catalog::operators()) {
    if (e.out_variant.empty() || catalog::out_variant_intercepted(e.out_variant)) continue;
    CHECK(e.out_variant == catalog::kOutVariantNotIntercepted);
    ++not_intercepted;
  }
  CHECK(not_intercepted == 1);
  CHECK_FALSE(catalog::out_variant_intercepted("aten::add.Tensor"));
}

TEST_CASE("catalog: expected outputs follow each rule, and the cost model counts them") {
  // layer_norm over [4, 6, 8] with normalized_shape [8]: out [4, 6, 8], mean and rstd [4, 6, 1].
  const OpSignature ln{"aten::native_layer_norm", "",
                       {Arg::tensor(tensor({4, 6, 8}, DType::kFloat16)), Arg::int_list({8}), Arg::none(), Arg::none(),
                        Arg::real(1e-5)},
                       Target{Backend::kCuda, "sm_90"}};
  const std::vector<TensorMeta> outs = catalog::expected_outputs(ln);
  REQUIRE(outs.size() == 3);
  CHECK(outs[0].sizes == std::vector<int64_t>{4, 6, 8});
  CHECK(outs[0].dtype == DType::kFloat16);
  CHECK(outs[1].sizes == std::vector<int64_t>{4, 6, 1});
  CHECK(outs[1].dtype == DType::kFloat32);   // float16 input: float32 statistics
  CHECK(outs[1].strides == std::vector<int64_t>{6, 1, 1});
  // add.Tensor broadcasts: [4, 1, 8] + [3, 1] gives [4, 3, 8].
  const OpSignature add{"aten::add", "Tensor",
                        {Arg::tensor(tensor({4, 1, 8})), Arg::tensor(tensor({3, 1})), Arg::integer(1)},
                        Target{Backend::kCpu, "x86_64"}};
  REQUIRE(catalog::expected_outputs(add).size() == 1);
  CHECK(catalog::expected_outputs(add)[0].sizes == std::vector<int64_t>{4, 3, 8});
  // group_norm's statistics are [N, group].
  const OpSignature gn{"aten::native_group_norm", "",
                       {Arg::tensor(tensor({2, 32, 16, 16})), Arg::none(), Arg::none(), Arg::integer(2), Arg::integer(32),
                        Arg::integer(256), Arg::integer(8), Arg::real(1e-5)},
                       Target{Backend::kCpu, "x86_64"}};
  REQUIRE(catalog::expected_outputs(gn).size() == 3);
  CHECK(catalog::expected_outputs(gn)[2].sizes == std::vector<int64_t>{2, 8});

  // Bytes: inputs read once, outputs written once; FLOPs per element of the largest input.
  const OpSignature softmax{"aten::_softmax", "", {Arg::tensor(tensor({4096, 4096}, DType::kFloat16)), Arg::integer(-1),
                                                   Arg::boolean(false)},
                            Target{Backend::kCuda, "sm_90"}};
  const catalog::OpCost c = catalog::op_cost(softmax);
  CHECK(c.bytes == 2.0 * 4096 * 4096 * 2);
  CHECK(c.flops == 5.0 * 4096 * 4096);
  const catalog::OpCost with_stats = catalog::op_cost(ln);
  CHECK(with_stats.bytes == 4 * 6 * 8 * 2 * 2 + 2 * 4 * 6 * 4);
  // Not a catalog operator: bytes still count, no FLOP model, no expected outputs.
  const OpSignature mm{"aten::mm", "", {Arg::tensor(tensor({8, 8})), Arg::tensor(tensor({8, 8}))}, Target{}};
  CHECK(catalog::op_cost(mm).flops == 0);
  CHECK(catalog::op_cost(mm).bytes == 2 * 64 * 4);
  CHECK(catalog::expected_outputs(mm).empty());
}
