// LaunchExpr: the expression language every launch plan number is written in. These tests pin
// down its grammar (precedence, associativity, every function), its errors (each class, with the
// exact column), its int64 boundaries (every overflow is an error, never a wrapped grid size), and
// that named and bound evaluation agree with an independent 128-bit evaluator on random input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "runtime/launch_expr.h"

using namespace kforge;

namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

const SizeMap& softmax_sizes() {
  static const SizeMap m{{"ndim0", 2},        {"numel0", 4096 * 50257}, {"size0_0", 4096},
                         {"size0_1", 50257},  {"stride0_0", 50257},     {"stride0_1", 1},
                         {"arg1", -1},        {"arg2", 0},              {"zero", 0},
                         {"big", kI64Max},       {"small", kI64Min}};
  return m;
}

// Parses and evaluates with the softmax sizes; fails the test on any error.
int64_t eval(std::string_view text, const SizeMap& sizes = softmax_sizes()) {
  auto e = LaunchExpr::parse(text);
  INFO(text);
  REQUIRE(e.ok());
  auto v = e->evaluate(sizes);
  INFO(v.status().to_string());
  REQUIRE(v.ok());
  return *v;
}

Status parse_error(std::string_view text) {
  auto e = LaunchExpr::parse(text);
  INFO(text);
  REQUIRE_FALSE(e.ok());
  return e.status();
}

Status eval_error(std::string_view text, const SizeMap& sizes = softmax_sizes()) {
  auto e = LaunchExpr::parse(text);
  INFO(text);
  REQUIRE(e.ok());
  auto v = e->evaluate(sizes);
  REQUIRE_FALSE(v.ok());
  return v.status();
}

// The column the caret points at (1-based), read from the caret line; 0 if there is none.
size_t caret_column(const std::string& message) {
  const size_t nl = message.rfind('\n');
  if (nl == std::string::npos) return 0;
  const std::string line = message.substr(nl + 1);
  const size_t caret = line.find('^');
  if (caret == std::string::npos || caret < 2) return 0;
  return caret - 2 + 1;   // the echo is indented by two spaces
}

// The message says "at column N" and the caret sits under column N.
void check_column(const Status& s, size_t column) {
  INFO(s.message());
  CHECK_THAT(s.message(), Catch::Contains("at column " + std::to_string(column)));
  CHECK(caret_column(s.message()) == column);
}

}  // namespace

// ---- grammar --------------------------------------------------------------------------------------

TEST_CASE("LaunchExpr: '*', '/' and '%' bind tighter than '+' and '-'") {
  CHECK(eval("1 + 2 * 3") == 7);
  CHECK(eval("(1 + 2) * 3") == 9);
  CHECK(eval("10 - 6 / 3") == 8);
  CHECK(eval("10 - 7 % 4") == 7);
  CHECK(eval("2 * 3 + 4 * 5") == 26);
}

TEST_CASE("LaunchExpr: binary operators of one precedence associate to the left") {
  CHECK(eval("10 - 4 - 3") == 3);        // (10 - 4) - 3, not 10 - (4 - 3)
  CHECK(eval("1 - 2 + 3") == 2);
  CHECK(eval("100 / 10 / 5") == 2);      // (100 / 10) / 5, not 100 / 2
  CHECK(eval("2 * 3 % 4") == 2);         // (2 * 3) % 4, not 2 * (3 % 4)
  CHECK(eval("7 % 4 * 3") == 9);
  CHECK(eval("64 / 4 * 2") == 32);
}

TEST_CASE("LaunchExpr: unary minus binds tightest and nests") {
  CHECK(eval("-2 * 3") == -6);
  CHECK(eval("-(2 + 3) * 2") == -10);
  CHECK(eval("- - 5") == 5);
  CHECK(eval("---5") == -5);
  CHECK(eval("2 - -3") == 5);
  CHECK(eval("-size0_1") == -50257);
  CHECK(eval("-arg1") == 1);
}

TEST_CASE("LaunchExpr: '/' and '%' truncate toward zero, as in C and CUDA") {
  CHECK(eval("7 / 2") == 3);
  CHECK(eval("-7 / 2") == -3);
  CHECK(eval("7 / -2") == -3);
  CHECK(eval("-7 / -2") == 3);
  CHECK(eval("7 % 2") == 1);
  CHECK(eval("-7 % 2") == -1);
  CHECK(eval("7 % -2") == 1);
  CHECK(eval("-7 % -2") == -1);
}

TEST_CASE("LaunchExpr: names are sizes of the signature") {
  CHECK(eval("numel0 / size0_1") == 4096);
  CHECK(eval("size0_0 * stride0_0 + stride0_1") == 4096 * 50257 + 1);
  CHECK(eval("arg1 + ndim0") == 1);   // normalizing dim=-1 of a 2-d tensor
  auto e = LaunchExpr::parse("ceil_div(numel0, size0_1) + numel0 * _x9 - size0_1");
  REQUIRE(e.ok());
  CHECK(e->names() == std::vector<std::string>{"numel0", "size0_1", "_x9"});   // first appearance
  CHECK(e->text() == "ceil_div(numel0, size0_1) + numel0 * _x9 - size0_1");
}

TEST_CASE("LaunchExpr: integer literals are decimal and span all of int64") {
  CHECK(eval("0") == 0);
  CHECK(eval("007") == 7);
  CHECK(eval("9223372036854775807") == kI64Max);
  CHECK(eval("-9223372036854775808") == kI64Min);   // the magnitude alone would not fit
  CHECK(eval("- 9223372036854775808") == kI64Min);
  CHECK(eval("-9223372036854775808 + 1") == kI64Min + 1);
}

TEST_CASE("LaunchExpr: whitespace separates tokens and is otherwise ignored") {
  CHECK(eval("\tceil_div ( numel0 ,256 )\n") == (4096 * 50257 + 255) / 256);
  CHECK(eval("1+2*3") == eval("  1 +  2 *\r\n 3 "));
}

TEST_CASE("LaunchExpr: ceil_div(a, b) is the ceiling of a / b") {
  CHECK(eval("ceil_div(10, 3)") == 4);
  CHECK(eval("ceil_div(9, 3)") == 3);
  CHECK(eval("ceil_div(1, 256)") == 1);
  CHECK(eval("ceil_div(0, 5)") == 0);
  CHECK(eval("ceil_div(-7, 2)") == -3);
  CHECK(eval("ceil_div(-8, 2)") == -4);
  CHECK(eval("ceil_div(9223372036854775807, 2)") == (kI64Max / 2) + 1);
  CHECK(eval("ceil_div(-9223372036854775808, 1)") == kI64Min);
  CHECK(eval("ceil_div(numel0, 1024)") == (4096 * 50257 + 1023) / 1024);
}

TEST_CASE("LaunchExpr: round_up(a, b) is the smallest multiple of b not below a") {
  CHECK(eval("round_up(10, 4)") == 12);
  CHECK(eval("round_up(12, 4)") == 12);
  CHECK(eval("round_up(0, 8)") == 0);
  CHECK(eval("round_up(-7, 4)") == -4);
  CHECK(eval("round_up(size0_1, 32)") == 50272);
  CHECK(eval("round_up(9223372036854775807, 1)") == kI64Max);
}

TEST_CASE("LaunchExpr: min and max take two or more arguments") {
  CHECK(eval("min(3, 1)") == 1);
  CHECK(eval("min(3, 1, 2)") == 1);
  CHECK(eval("max(3, 1, 2)") == 3);
  CHECK(eval("min(-1, -5)") == -5);
  CHECK(eval("max(-1, -5, -3, -2)") == -1);
  CHECK(eval("min(small, big)") == kI64Min);
  CHECK(eval("max(small, big)") == kI64Max);
  CHECK(eval("min(1024, round_up(size0_1, 32))") == 1024);
}

TEST_CASE("LaunchExpr: clamp(x, lo, hi) limits x to [lo, hi]") {
  CHECK(eval("clamp(5, 0, 3)") == 3);
  CHECK(eval("clamp(-1, 0, 3)") == 0);
  CHECK(eval("clamp(2, 0, 3)") == 2);
  CHECK(eval("clamp(7, 7, 7)") == 7);
  CHECK(eval("clamp(size0_1 / 32, 32, 1024)") == 1024);
}

TEST_CASE("LaunchExpr: select(c, a, b) is a when c != 0, else b, and runs only that branch") {
  CHECK(eval("select(1, 10, 20)") == 10);
  CHECK(eval("select(0, 10, 20)") == 20);
  CHECK(eval("select(-3, 10, 20)") == 10);
  CHECK(eval("select(arg2, 1, 2) + select(ndim0 - 2, 100, 200)") == 202);
  // The guard idiom: the division is never evaluated when its divisor is zero.
  CHECK(eval("select(zero, 4096 / zero, 7)") == 7);
  CHECK(eval("select(1, 5, big + 1)") == 5);
  CHECK(eval("select(select(0, 1, 0), 1, select(1, 2, 3))") == 2);
}

TEST_CASE("LaunchExpr: functions nest inside each other and inside operators") {
  CHECK(eval("ceil_div(numel0, min(1024, round_up(size0_1, 32))) * 2 + 1") ==
        ((4096 * 50257 + 1023) / 1024) * 2 + 1);
  CHECK(eval("max(1, ceil_div(size0_1, clamp(arg1 + 2, 1, 8)))") == 50257);
}

// ---- parse errors --------------------------------------------------------------------------------

TEST_CASE("LaunchExpr parse errors: the message names the column and draws a caret") {
  Status s = parse_error("ceil_div(numel0,, 256)");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() ==
        "launch expression \"ceil_div(numel0,, 256)\": unexpected ',' at column 17\n"
        "  ceil_div(numel0,, 256)\n"
        "                  ^");
}

TEST_CASE("LaunchExpr parse errors: misplaced tokens") {
  check_column(parse_error("1 +"), 4);              // end of expression
  check_column(parse_error("* 2"), 1);
  check_column(parse_error("1 + * 2"), 5);
  check_column(parse_error("()"), 2);
  check_column(parse_error("min()"), 5);
  check_column(parse_error("ceil_div(a,)"), 12);
  CHECK_THAT(parse_error("1 +").message(), Catch::Contains("unexpected end of expression"));
}

TEST_CASE("LaunchExpr parse errors: unknown functions, and functions used as names") {
  Status s = parse_error("2 * foo(1)");
  check_column(s, 5);
  CHECK_THAT(s.message(), Catch::Contains("unknown function 'foo'"));
  CHECK_THAT(s.message(), Catch::Contains("ceil_div, clamp, max, min, round_up, select"));
  // Names are case-sensitive: MIN is not min.
  check_column(parse_error("MIN(1, 2)"), 1);
  s = parse_error("min + 1");
  check_column(s, 1);
  CHECK_THAT(s.message(), Catch::Contains("function 'min' without arguments"));
}

TEST_CASE("LaunchExpr parse errors: wrong number of arguments") {
  Status s = parse_error("ceil_div(a)");
  check_column(s, 11);   // the ')' that came too early
  CHECK_THAT(s.message(), Catch::Contains("ceil_div takes 2 arguments, found 1"));
  s = parse_error("ceil_div(a, b, c)");
  check_column(s, 14);   // the ',' that starts a third argument
  CHECK_THAT(s.message(), Catch::Contains("ceil_div takes 2 arguments"));
  check_column(parse_error("round_up(1, 2, 3)"), 14);
  check_column(parse_error("clamp(1, 2)"), 11);
  check_column(parse_error("select(1, 2)"), 12);
  check_column(parse_error("select(1, 2, 3, 4)"), 15);
  s = parse_error("max(7)");
  check_column(s, 6);
  CHECK_THAT(s.message(), Catch::Contains("max takes at least 2 arguments, found 1"));
}

TEST_CASE("LaunchExpr parse errors: unbalanced parentheses") {
  Status s = parse_error("(a + b");
  check_column(s, 7);
  CHECK_THAT(s.message(), Catch::Contains("'(' at column 1"));
  s = parse_error("ceil_div(a, b");
  check_column(s, 14);
  CHECK_THAT(s.message(), Catch::Contains("'(' at column 9"));
  s = parse_error("a + b)");
  check_column(s, 6);
  CHECK_THAT(s.message(), Catch::Contains("no '(' to match"));
  check_column(parse_error("((1)"), 5);
  check_column(parse_error("(1))"), 4);
}

TEST_CASE("LaunchExpr parse errors: trailing garbage") {
  check_column(parse_error("a b"), 3);
  check_column(parse_error("1 2"), 3);
  check_column(parse_error("256x"), 4);   // a number does not run into a name
  check_column(parse_error("ceil_div(a, b) c"), 16);
}

TEST_CASE("LaunchExpr parse errors: characters outside the language") {
  Status s = parse_error("a $ b");
  check_column(s, 3);
  CHECK_THAT(s.message(), Catch::Contains("unexpected character '$'"));
  s = parse_error("a + \x01");
  check_column(s, 5);
  CHECK_THAT(s.message(), Catch::Contains("byte 0x01"));
  CHECK(s.message().find('\x01') == std::string::npos);   // echoed as '?', so the caret lines up
  check_column(parse_error("a == b"), 3);
  check_column(parse_error("1.5"), 2);
  check_column(parse_error("a ? b : c"), 3);
  check_column(parse_error("numel0 \xc3\xa9"), 8);
}

TEST_CASE("LaunchExpr parse errors: empty text") {
  for (std::string_view text : {"", "   ", "\t\n"}) {
    Status s = parse_error(text);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("empty expression"));
  }
}

TEST_CASE("LaunchExpr parse errors: text longer than 1024 bytes") {
  std::string ok = "1";
  while (ok.size() + 4 <= LaunchExpr::kMaxTextLength) ok += " + 1";
  ok.resize(LaunchExpr::kMaxTextLength, ' ');
  CHECK(eval(ok) == std::count(ok.begin(), ok.end(), '1'));
  Status s = parse_error(ok + " ");
  CHECK(s.code() == StatusCode::kOutOfRange);
  CHECK_THAT(s.message(), Catch::Contains("1025 bytes exceeds the limit of 1024"));
  CHECK(s.message().size() < 200);   // the text is not echoed in full
}

TEST_CASE("LaunchExpr parse errors: nesting deeper than 64") {
  auto nested = [](size_t depth) { return std::string(depth, '(') + "1" + std::string(depth, ')'); };
  CHECK(eval(nested(64)) == 1);
  Status s = parse_error(nested(65));
  CHECK(s.code() == StatusCode::kOutOfRange);
  check_column(s, 65);   // the 65th '('
  CHECK_THAT(s.message(), Catch::Contains("nesting deeper than 64"));
  // Calls and unary minuses nest too.
  std::string calls;
  for (int i = 0; i < 65; ++i) calls += "min(1, ";
  calls += "1" + std::string(65, ')');
  check_column(parse_error(calls), 64 * 7 + 4);   // the '(' of the 65th min
  CHECK(eval(std::string(64, '-') + "arg1") == -1);
  check_column(parse_error(std::string(65, '-') + "arg1"), 65);
}

TEST_CASE("LaunchExpr parse errors: integer literals outside int64") {
  Status s = parse_error("9223372036854775808");
  CHECK(s.code() == StatusCode::kOutOfRange);
  check_column(s, 1);
  CHECK_THAT(s.message(), Catch::Contains("integer literal 9223372036854775808 does not fit in int64"));
  check_column(parse_error("-9223372036854775809"), 1);
  check_column(parse_error("1 + 99999999999999999999999999"), 5);
  check_column(parse_error("2 - 9223372036854775808"), 5);   // binary minus: the literal stands alone
}

// ---- evaluation errors ---------------------------------------------------------------------------

TEST_CASE("LaunchExpr evaluation: an unknown size is named with what is available") {
  Status s = eval_error("ceil_div(numel1, 256)", {{"numel0", 1}, {"size0_0", 1}});
  CHECK(s.code() == StatusCode::kNotFound);
  check_column(s, 10);
  CHECK_THAT(s.message(), Catch::Contains("unknown size 'numel1'"));
  CHECK_THAT(s.message(), Catch::Contains("(available: numel0, size0_0)"));
  // A long list is truncated.
  SizeMap many;
  for (int i = 0; i < 40; ++i) many["size0_" + std::to_string(i)] = i;
  s = eval_error("x", many);
  CHECK_THAT(s.message(), Catch::Contains("and 28 more)"));
  CHECK_THAT(eval_error("x", {}).message(), Catch::Contains("(available: none)"));
  // Even in a branch select does not take: the plan names a size the signature lacks.
  check_column(eval_error("select(1, 2, missing)"), 14);
}

TEST_CASE("LaunchExpr evaluation: division and modulo by zero name the sub-expression") {
  Status s = eval_error("1 + (numel0 / (size0_1 - size0_1)) * 2");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  check_column(s, 13);
  CHECK_THAT(s.message(), Catch::Contains("division by zero in \"numel0 / (size0_1 - size0_1)\""));
  s = eval_error("max(1, 7 % zero)");
  check_column(s, 10);
  CHECK_THAT(s.message(), Catch::Contains("modulo by zero in \"7 % zero\""));
}

TEST_CASE("LaunchExpr evaluation: ceil_div and round_up need a positive divisor") {
  Status s = eval_error("2 * ceil_div(numel0, zero)");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  check_column(s, 5);
  CHECK_THAT(s.message(), Catch::Contains("ceil_div divisor must be positive, got 0"));
  CHECK_THAT(s.message(), Catch::Contains("\"ceil_div(numel0, zero)\""));
  CHECK_THAT(eval_error("ceil_div(8, -2)").message(), Catch::Contains("got -2"));
  check_column(eval_error("round_up(8, 0)"), 1);
  CHECK_THAT(eval_error("round_up(8, arg1)").message(), Catch::Contains("round_up multiple must be positive, got -1"));
}

TEST_CASE("LaunchExpr evaluation: clamp with lo > hi is an error") {
  Status s = eval_error("clamp(5, 8, 3)");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("clamp bounds are inverted (lo 8 > hi 3)"));
}

TEST_CASE("LaunchExpr evaluation: every int64 overflow is an error, at the boundary exactly") {
  auto overflows = [](std::string_view text, size_t column) {
    Status s = eval_error(text);
    CHECK(s.code() == StatusCode::kOutOfRange);
    CHECK_THAT(s.message(), Catch::Contains("int64 overflow"));
    check_column(s, column);
  };
  CHECK(eval("9223372036854775806 + 1") == kI64Max);
  overflows("9223372036854775807 + 1", 21);
  overflows("big + 1", 5);
  CHECK(eval("small + 0") == kI64Min);
  overflows("small - 1", 7);
  overflows("1 - small", 3);                   // 1 + 2^63
  CHECK(eval("-1 - big") == kI64Min);
  CHECK(eval("4611686018427387904 * -2") == kI64Min);
  overflows("4611686018427387904 * 2", 21);
  CHECK(eval("3037000499 * 3037000499") == 3037000499LL * 3037000499LL);
  overflows("3037000500 * 3037000500", 12);
  overflows("small * -1", 7);
  overflows("-9223372036854775808 / -1", 22);   // C leaves this undefined; here it is an error
  CHECK(eval("-9223372036854775808 / 1") == kI64Min);
  CHECK(eval("-9223372036854775808 % -1") == 0);   // exact; C would trap on x86
  overflows("-small", 1);
  overflows("-(-9223372036854775808)", 1);
  overflows("round_up(big, 2)", 1);
  overflows("round_up(9223372036854775800, 16)", 1);
  CHECK(eval("round_up(9223372036854775792, 16)") == 9223372036854775792LL);
  // The message carries the operands.
  CHECK_THAT(eval_error("big * 2").message(), Catch::Contains("(9223372036854775807 * 2)"));
}

TEST_CASE("LaunchExpr evaluation: a failure inside a nested expression names that part") {
  Status s = eval_error("max(1, ceil_div(size0_1 * (big - 2), 4))");
  CHECK(s.code() == StatusCode::kOutOfRange);
  check_column(s, 25);
  CHECK_THAT(s.message(), Catch::Contains("in \"size0_1 * (big - 2)\""));
}

// ---- bound evaluation ----------------------------------------------------------------------------

TEST_CASE("BoundExpr: evaluates by slot position with the same value as by name") {
  auto e = LaunchExpr::parse("ceil_div(numel0, size0_1) + arg1");
  REQUIRE(e.ok());
  auto b = e->bind({"arg1", "x", "numel0", "size0_1"});
  REQUIRE(b.ok());
  CHECK(b->text() == e->text());
  const std::array<int64_t, 4> slots{-1, 999, 4096 * 50257, 50257};
  auto v = b->evaluate(slots);
  REQUIRE(v.ok());
  CHECK(*v == 4095);
  CHECK(*v == *e->evaluate(softmax_sizes()));
  // A repeated slot name binds to its first position.
  auto dup = LaunchExpr::parse("a")->bind({"b", "a", "a"});
  REQUIRE(dup.ok());
  CHECK(*dup->evaluate(std::array<int64_t, 3>{1, 2, 3}) == 2);
  // An expression without names needs no slots.
  auto constant = LaunchExpr::parse("6 * 7")->bind({});
  REQUIRE(constant.ok());
  CHECK(*constant->evaluate({}) == 42);
}

TEST_CASE("BoundExpr: binding fails for a name with no slot, and too few slots fail") {
  auto e = LaunchExpr::parse("a + b");
  REQUIRE(e.ok());
  auto missing = e->bind({"a", "c"});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  check_column(missing.status(), 5);
  CHECK_THAT(missing.status().message(), Catch::Contains("unknown size 'b'"));
  auto b = e->bind({"x", "a", "b"});
  REQUIRE(b.ok());
  auto short_slots = b->evaluate(std::array<int64_t, 2>{1, 2});
  REQUIRE_FALSE(short_slots.ok());
  CHECK(short_slots.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(short_slots.status().message(), Catch::Contains("bound to 3 slots, evaluated with 2 values"));
}

TEST_CASE("BoundExpr: errors are the same as with names") {
  const SizeMap sizes{{"a", 7}, {"b", 0}};
  const std::vector<std::string> names{"a", "b"};
  const std::array<int64_t, 2> slots{7, 0};
  for (std::string_view text : {"a / b", "a % (b * 3)", "ceil_div(a, b)", "-(a - 9223372036854775807 - 8)",
                                "clamp(a, 1, b)", "c + a"}) {
    auto e = LaunchExpr::parse(text);
    REQUIRE(e.ok());
    auto by_name = e->evaluate(sizes);
    auto bound = e->bind(names);
    Status by_slot = bound.ok() ? bound->evaluate(slots).status() : bound.status();
    INFO(text);
    REQUIRE_FALSE(by_name.ok());
    CHECK(by_slot.code() == by_name.status().code());
    CHECK(by_slot.message() == by_name.status().message());
  }
}

// ---- random expressions against an independent evaluator ----------------------------------------

namespace {

__extension__ typedef __int128 i128;

// A random expression tree, its text, and its value computed in 128 bits with the language's
// rules written out independently: every intermediate must fit int64, and select is lazy.
class RandomExpr {
 public:
  explicit RandomExpr(uint64_t seed) : rng_(seed) {}

  struct Case {
    std::string text;
    std::optional<int64_t> value;      // nullopt: evaluation must fail
    std::vector<std::string> names;    // in order of first appearance
  };

  Case next(const SizeMap& sizes) {
    sizes_ = &sizes;
    Node n;
    Case c;
    do {   // a rare wide tree renders beyond the length limit; draw another
      names_.clear();
      n = gen(0);
      c.text = render(n).text;
    } while (c.text.size() > LaunchExpr::kMaxTextLength);
    c.value = value_of(n);
    c.names = names_;
    return c;
  }

 private:
  enum class K { kConst, kName, kNeg, kAdd, kSub, kMul, kDiv, kMod, kCeilDiv, kRoundUp, kMin, kMax, kClamp, kSelect };
  struct Node {
    K k = K::kConst;
    int64_t v = 0;
    std::string name;
    std::vector<Node> kids;
  };
  struct Text {
    std::string text;
    int prec;   // 1: + -, 2: * / %, 3: unary, 4: atom or call
  };

  uint64_t pick(uint64_t n) { return rng_() % n; }

  Node gen(int depth) {
    const uint64_t r = pick(depth >= 4 ? 2 : 14);
    Node n{static_cast<K>(r), 0, {}, {}};
    switch (n.k) {
      case K::kConst: {
        static constexpr std::array<int64_t, 12> kConsts{0, 1, 2, 3, 7, 32, 255, 1024, 3037000500,
                                                          4611686018427387904, kI64Max - 1, kI64Max};
        n.v = kConsts[pick(kConsts.size())];
        break;
      }
      case K::kName: {
        auto it = sizes_->begin();
        std::advance(it, static_cast<long>(pick(sizes_->size())));
        n.name = it->first;
        break;
      }
      case K::kNeg: n.kids.push_back(gen(depth + 1)); break;
      case K::kMin:
      case K::kMax: {
        const uint64_t count = 2 + pick(3);
        for (uint64_t i = 0; i < count; ++i) n.kids.push_back(gen(depth + 1));
        break;
      }
      case K::kClamp:
      case K::kSelect:
        for (int i = 0; i < 3; ++i) n.kids.push_back(gen(depth + 1));
        break;
      default:
        for (int i = 0; i < 2; ++i) n.kids.push_back(gen(depth + 1));
        break;
    }
    return n;
  }

  std::string space() { return pick(4) == 0 ? " " : ""; }

  Text paren(Text t, bool needed) {
    if (needed || pick(10) == 0) return {"(" + space() + t.text + space() + ")", 4};
    return t;
  }

  Text call(std::string_view fn, const std::vector<Node>& kids) {
    std::string s = std::string(fn) + space() + "(";
    for (size_t i = 0; i < kids.size(); ++i) {
      if (i > 0) s += space() + "," + space();
      s += render(kids[i]).text;
    }
    return {s + space() + ")", 4};
  }

  Text binary(const Node& n, std::string_view op, int prec) {
    Text l = paren(render(n.kids[0]), false);
    if (l.prec < prec) l = paren(l, true);
    Text r = paren(render(n.kids[1]), false);
    if (r.prec <= prec) r = paren(r, true);   // left-associative: a - (b - c) needs them
    return {l.text + space() + std::string(op) + space() + r.text, prec};
  }

  // Renders in text order, so names_ records first appearances as the parser sees them.
  Text render(const Node& n) {
    switch (n.k) {
      case K::kConst: return {std::to_string(n.v), 4};
      case K::kName:
        if (std::find(names_.begin(), names_.end(), n.name) == names_.end()) names_.push_back(n.name);
        return {n.name, 4};
      case K::kNeg: {
        Text t = paren(render(n.kids[0]), false);
        if (t.prec < 3) t = paren(t, true);
        return {"-" + space() + t.text, 3};
      }
      case K::kAdd: return binary(n, "+", 1);
      case K::kSub: return binary(n, "-", 1);
      case K::kMul: return binary(n, "*", 2);
      case K::kDiv: return binary(n, "/", 2);
      case K::kMod: return binary(n, "%", 2);
      case K::kCeilDiv: return call("ceil_div", n.kids);
      case K::kRoundUp: return call("round_up", n.kids);
      case K::kMin: return call("min", n.kids);
      case K::kMax: return call("max", n.kids);
      case K::kClamp: return call("clamp", n.kids);
      case K::kSelect: return call("select", n.kids);
    }
    return {"?", 4};
  }

  static std::optional<int64_t> fit(i128 v) {
    if (v < kI64Min || v > kI64Max) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  static i128 floor_div(i128 a, i128 b) {
    const i128 q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
  }

  std::optional<int64_t> value_of(const Node& n) {
    switch (n.k) {
      case K::kConst: return n.v;
      case K::kName: return sizes_->at(n.name);
      case K::kSelect: {
        auto c = value_of(n.kids[0]);
        if (!c) return std::nullopt;
        return value_of(n.kids[*c != 0 ? 1 : 2]);
      }
      default: break;
    }
    std::vector<i128> v;
    for (const Node& k : n.kids) {
      auto x = value_of(k);
      if (!x) return std::nullopt;
      v.push_back(*x);
    }
    switch (n.k) {
      case K::kNeg: return fit(-v[0]);
      case K::kAdd: return fit(v[0] + v[1]);
      case K::kSub: return fit(v[0] - v[1]);
      case K::kMul: return fit(v[0] * v[1]);
      case K::kDiv: return v[1] == 0 ? std::nullopt : fit(v[0] / v[1]);
      case K::kMod: return v[1] == 0 ? std::nullopt : fit(v[0] % v[1]);
      case K::kCeilDiv: return v[1] <= 0 ? std::nullopt : fit(-floor_div(-v[0], v[1]));
      case K::kRoundUp: return v[1] <= 0 ? std::nullopt : fit(-floor_div(-v[0], v[1]) * v[1]);
      case K::kMin: return fit(*std::min_element(v.begin(), v.end()));
      case K::kMax: return fit(*std::max_element(v.begin(), v.end()));
      case K::kClamp: return v[1] > v[2] ? std::nullopt : fit(std::min(std::max(v[0], v[1]), v[2]));
      default: return std::nullopt;
    }
  }

  std::mt19937_64 rng_;
  const SizeMap* sizes_ = nullptr;
  std::vector<std::string> names_;
};

}  // namespace

TEST_CASE("LaunchExpr: named and bound evaluation agree with a 128-bit reference on random expressions") {
  const SizeMap sizes{{"zero", 0},         {"one", 1},           {"neg1", -1},       {"numel0", 205852672},
                      {"size0_1", 50257},  {"arg1", -7},         {"big", kI64Max},      {"small", kI64Min},
                      {"half", kI64Max / 2},  {"root", 3037000500}, {"nroot", -3037000500}};
  // Slots in another order than the map, with an unused one, to exercise the index remapping.
  std::vector<std::string> slot_names;
  std::vector<int64_t> slots;
  for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
    slot_names.push_back(it->first);
    slots.push_back(it->second);
    if (slot_names.size() == 3) {
      slot_names.push_back("unused");
      slots.push_back(12345);
    }
  }
  RandomExpr gen(20240611);
  int ok = 0, failed = 0;
  for (int i = 0; i < 20000; ++i) {
    const RandomExpr::Case c = gen.next(sizes);
    INFO(c.text);
    auto e = LaunchExpr::parse(c.text);
    REQUIRE(e.ok());
    CHECK(e->names() == c.names);
    auto by_name = e->evaluate(sizes);
    auto bound = e->bind(slot_names);
    REQUIRE(bound.ok());
    auto by_slot = bound->evaluate(slots);
    REQUIRE(by_name.ok() == c.value.has_value());
    REQUIRE(by_slot.ok() == c.value.has_value());
    if (c.value) {
      REQUIRE(*by_name == *c.value);
      REQUIRE(*by_slot == *c.value);
      ++ok;
    } else {
      REQUIRE(by_slot.status().message() == by_name.status().message());
      ++failed;
    }
  }
  // The generator must exercise both outcomes in earnest.
  CHECK(ok > 4000);
  CHECK(failed > 2000);
}

TEST_CASE("LaunchExpr: copies share the parsed program and compare by text") {
  auto e = LaunchExpr::parse("a + 1");
  REQUIRE(e.ok());
  LaunchExpr copy = *e;
  CHECK(copy == *e);
  CHECK(&copy.text() == &e->text());
  CHECK_FALSE(*LaunchExpr::parse("a+1") == *e);
}
