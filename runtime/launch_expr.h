// LaunchExpr: the integer expression language of launch plans. Grid and block dimensions, dynamic
// shared memory, scratch sizes, output sizes/strides and size arguments are all written in it,
// over the named sizes of a signature (OpSignature::named_sizes(): numel0, size0_1, stride0_1,
// ndim0, arg2, ...).
//
//   StatusOr<LaunchExpr> e = LaunchExpr::parse("ceil_div(numel0, 256)");
//   if (!e.ok()) return e.status();          // message names the column, with a caret line
//   StatusOr<int64_t> blocks = e->evaluate(sig.named_sizes());
//
//   // Hot path: bind the names to slot positions once, then evaluate with no string lookups and
//   // no allocation (only the error path allocates, to build its message).
//   StatusOr<BoundExpr> b = e->bind({"numel0", "size0_1"});
//   StatusOr<int64_t> v = b->evaluate(std::array<int64_t, 2>{4096 * 50257, 50257});
//
// Language (see Note [Launch expression semantics] in launch_expr.cc):
//   expr     := term (('+' | '-') term)*
//   term     := unary (('*' | '/' | '%') unary)*
//   unary    := '-' unary | primary
//   primary  := INTEGER | NAME | NAME '(' expr (',' expr)* ')' | '(' expr ')'
//   INTEGER  := [0-9]+              (must fit int64; '-' directly before it makes it negative, so
//                                    -9223372036854775808 is a valid literal)
//   NAME     := [A-Za-z_][A-Za-z0-9_]*
//   functions: ceil_div(a, b)   ceiling of a / b; b must be > 0
//              round_up(a, b)   smallest multiple of b that is >= a; b must be > 0
//              min(a, b, ...)   max(a, b, ...)   two or more arguments
//              clamp(x, lo, hi) lo <= hi required
//              select(c, a, b)  c != 0 ? a : b; only the chosen branch is evaluated
//   '/' and '%' truncate toward zero, as in C (-7 / 2 == -3, -7 % 2 == -1).
//   Whitespace (space, tab, CR, LF) separates tokens and is otherwise ignored.
//
// Promises:
//   - Values are int64. Every operation that would leave int64 (a + b, a * b, -INT64_MIN,
//     INT64_MIN / -1, ...) is an evaluation error, never undefined behavior or a wrapped value.
//   - parse() errors are kInvalidArgument, or kOutOfRange for limits (text over kMaxTextLength
//     bytes, nesting over kMaxDepth, a literal outside int64). Their message names the column
//     (1-based byte offset) of the bad token and shows a caret under it.
//   - evaluate() errors: kNotFound for an unknown size name (it lists the available names),
//     kOutOfRange for int64 overflow, kInvalidArgument for division or modulo by zero, a
//     non-positive ceil_div/round_up divisor and inverted clamp bounds. The message quotes the
//     failing sub-expression and the column of its operator.
//   - An expression that references a name that is not available fails even if that name sits in
//     the untaken branch of a select: a plan that names a size the signature lacks is a bug.
//   - evaluate() with a map and BoundExpr::evaluate() give identical values and identical errors
//     for the same sizes. Nothing here throws.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace kforge {

// The sizes an expression is evaluated against (the type OpSignature::named_sizes() returns).
using SizeMap = std::map<std::string, int64_t, std::less<>>;

namespace launch_expr_internal {
struct Program;
struct Bound;
}  // namespace launch_expr_internal

class BoundExpr;

class LaunchExpr {
 public:
  static constexpr size_t kMaxTextLength = 1024;   // bytes of expression text
  static constexpr size_t kMaxDepth = 64;          // nested parentheses, calls and unary minuses

  // Parses `text` once into a compact stack program. Never throws.
  static StatusOr<LaunchExpr> parse(std::string_view text);

  // Evaluates against named sizes. Does not allocate unless it fails.
  StatusOr<int64_t> evaluate(const SizeMap& sizes) const;

  // Resolves every referenced name to its position in `slot_names` (the first one, if a name
  // repeats). Fails with kNotFound if a referenced name is missing.
  StatusOr<BoundExpr> bind(const std::vector<std::string>& slot_names) const;

  // The text as given to parse().
  const std::string& text() const noexcept;
  // The distinct size names the expression references, in order of first appearance.
  std::vector<std::string> names() const;

  friend bool operator==(const LaunchExpr& a, const LaunchExpr& b) { return a.text() == b.text(); }

 private:
  explicit LaunchExpr(std::shared_ptr<const launch_expr_internal::Program> p) : program_(std::move(p)) {}
  std::shared_ptr<const launch_expr_internal::Program> program_;   // immutable, shared by copies
};

// A LaunchExpr with its names replaced by slot positions. Cheap to copy: the program is shared.
class BoundExpr {
 public:
  // `slots[i]` is the value of slot_names[i] given to bind(). Fails with kInvalidArgument if
  // `slots` is shorter than that list. No string lookups; allocates only when it fails.
  StatusOr<int64_t> evaluate(std::span<const int64_t> slots) const;

  const std::string& text() const noexcept;

 private:
  friend class LaunchExpr;
  explicit BoundExpr(std::shared_ptr<const launch_expr_internal::Bound> b) : bound_(std::move(b)) {}
  std::shared_ptr<const launch_expr_internal::Bound> bound_;   // immutable, shared by copies
};

}  // namespace kforge
