#include "runtime/launch_expr.h"

#include <algorithm>
#include <array>
#include <limits>

// Note [Launch expression semantics]
// Launch plans come from proposers (an LLM among them), so an expression is untrusted input that
// ends up sizing a grid or an allocation. Three decisions follow from that:
//  - Integers are int64 and every step is overflow-checked (__builtin_*_overflow), including the
//    two cases C leaves undefined: -INT64_MIN and INT64_MIN / -1. INT64_MIN % -1 is 0, which is
//    the exact answer, so it is not an error. A wrapped grid size would launch a wrong kernel.
//  - '/' and '%' truncate toward zero like C and CUDA, so a plan reads the way the kernel code it
//    sits next to reads. ceil_div and round_up are what plans need for rounding up; they take
//    only positive divisors, which is the only case a launch plan has a use for.
//  - select(c, a, b) evaluates only the chosen branch, so `select(n, 4096 / n, 1)` is a guard
//    and not a division by zero. Names in both branches must still exist (see the header).
//
// Note [Launch expression program]
// parse() compiles to a flat stack program (reverse Polish order, plus two jumps for select).
// Evaluation is one loop over a vector with a fixed-size stack array: no recursion, no heap, no
// string work unless an error message has to be built. min/max with n arguments compile to n-1
// binary steps, so the stack holds at most a few values per nesting level, and the parser proves
// the bound (kStackCapacity) for every program it accepts.

namespace kforge {
namespace launch_expr_internal {

enum class OpCode : uint8_t {
  kConst, kLoad, kNeg, kAdd, kSub, kMul, kDiv, kMod,
  kCeilDiv, kRoundUp, kMin, kMax, kClamp, kJumpIfZero, kJump,
};

struct Op {
  OpCode code = OpCode::kConst;
  uint16_t begin = 0;   // the sub-expression this op computes, [begin, end) in bytes of the text
  uint16_t end = 0;
  uint16_t at = 0;      // the operator or function name, for the caret
  int64_t imm = 0;      // constant, name index (slot index once bound), or jump target
};

struct Program {
  std::string text;
  std::vector<Op> ops;
  std::vector<std::string> names;   // distinct, in order of first appearance
  std::vector<uint16_t> name_at;    // byte offset of each name's first appearance
};

struct Bound {
  std::shared_ptr<const Program> program;
  std::vector<Op> ops;       // kLoad's imm is a slot index
  size_t slot_count = 0;     // 1 + the largest slot index used
};

}  // namespace launch_expr_internal

namespace {

using launch_expr_internal::Bound;
using launch_expr_internal::Op;
using launch_expr_internal::OpCode;
using launch_expr_internal::Program;

// 3 pending values per nesting level (clamp's x and lo, plus a binary operator's left side) and
// kMaxDepth levels stay far below this; the parser rejects anything that would not.
constexpr size_t kStackCapacity = 256;
constexpr size_t kMaxQuoted = 64;        // sub-expression text quoted in an evaluation error
constexpr size_t kMaxListedNames = 12;   // available names listed in an unknown-name error

// The echo of the text in messages: one byte per column, so the caret lines up. Whitespace
// becomes a space and anything else unprintable a '?'.
std::string sanitize(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c == '\t' || c == '\n' || c == '\r') {
      c = ' ';
    } else if (c < 0x20 || c > 0x7e) {
      c = '?';
    }
  }
  return out;
}

std::string header(std::string_view text) {
  if (text.size() > LaunchExpr::kMaxTextLength) {
    return "launch expression \"" + sanitize(text.substr(0, 32)) + "...\": ";
  }
  return "launch expression \"" + sanitize(text) + "\": ";
}

// "<header><what> at column N<detail>" plus the text and a caret under column N.
[[gnu::cold]] Status located(StatusCode code, std::string_view text, std::string_view what, size_t at,
                             std::string_view detail = {}) {
  std::string m = header(text);
  m += what;
  m += " at column ";
  m += std::to_string(at + 1);
  m += detail;
  m += "\n  ";
  m += sanitize(text);
  m += "\n  ";
  m.append(at, ' ');
  m += '^';
  return Status(code, std::move(m));
}

std::string quoted_span(const Program& p, const Op& op) {
  std::string_view s = std::string_view(p.text).substr(op.begin, op.end - op.begin);
  if (s.size() > kMaxQuoted) return "\"" + sanitize(s.substr(0, kMaxQuoted)) + "...\"";
  return "\"" + sanitize(s) + "\"";
}

[[gnu::cold]] [[gnu::noinline]] Status op_error(StatusCode code, const Program& p, const Op& op,
                                                 const std::string& what) {
  return located(code, p.text, what + " in " + quoted_span(p, op), op.at);
}

[[gnu::cold]] [[gnu::noinline]] Status overflow(const Program& p, const Op& op, int64_t a, int64_t b) {
  std::string detail;
  const std::string sa = std::to_string(a), sb = std::to_string(b);
  switch (op.code) {
    case OpCode::kNeg: detail = "-(" + sa + ")"; break;
    case OpCode::kAdd: detail = sa + " + " + sb; break;
    case OpCode::kSub: detail = sa + " - " + sb; break;
    case OpCode::kMul: detail = sa + " * " + sb; break;
    case OpCode::kDiv: detail = sa + " / " + sb; break;
    case OpCode::kRoundUp: detail = "round_up(" + sa + ", " + sb + ")"; break;
    default: detail = sa + ", " + sb; break;
  }
  return op_error(StatusCode::kOutOfRange, p, op, "int64 overflow (" + detail + ")");
}

// Names every referenced size that is missing as `name`; lists what there is, truncated.
template <typename Names>
[[gnu::cold]] Status unknown_name(const Program& p, size_t name_index, const Names& available) {
  std::string detail = " (available: ";
  size_t listed = 0, total = 0;
  for (const auto& n : available) {
    ++total;
    if (listed == kMaxListedNames) continue;
    if (listed > 0) detail += ", ";
    detail += std::string_view(n);
    ++listed;
  }
  if (total == 0) detail += "none";
  if (total > listed) detail += ", and " + std::to_string(total - listed) + " more";
  detail += ")";
  return located(StatusCode::kNotFound, p.text, "unknown size '" + p.names[name_index] + "'",
                 p.name_at[name_index], detail);
}

// The evaluation loop shared by named and bound evaluation (Note [Launch expression program]).
// `load(i)` yields the value of name/slot i. Hot path: no allocation unless it fails.
template <typename Load>
StatusOr<int64_t> run(const Program& p, const std::vector<Op>& ops, Load&& load) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  std::array<int64_t, kStackCapacity> stack;   // NOLINT: written before read, by construction
  size_t sp = 0;
  size_t pc = 0;
  const size_t n = ops.size();
  while (pc < n) {
    const Op& op = ops[pc++];
    switch (op.code) {
      case OpCode::kConst: stack[sp++] = op.imm; break;
      case OpCode::kLoad: stack[sp++] = load(static_cast<size_t>(op.imm)); break;
      case OpCode::kNeg: {
        int64_t& x = stack[sp - 1];
        if (x == kMin) return overflow(p, op, x, 0);
        x = -x;
        break;
      }
      case OpCode::kJumpIfZero:
        if (stack[--sp] == 0) pc = static_cast<size_t>(op.imm);
        break;
      case OpCode::kJump: pc = static_cast<size_t>(op.imm); break;
      case OpCode::kClamp: {
        const int64_t hi = stack[--sp];
        const int64_t lo = stack[--sp];
        int64_t& x = stack[sp - 1];
        if (lo > hi) {
          return op_error(StatusCode::kInvalidArgument, p, op,
                          "clamp bounds are inverted (lo " + std::to_string(lo) + " > hi " +
                              std::to_string(hi) + ")");
        }
        x = x < lo ? lo : (x > hi ? hi : x);
        break;
      }
      default: {
        const int64_t b = stack[--sp];
        int64_t& a = stack[sp - 1];
        int64_t r = 0;
        switch (op.code) {
          case OpCode::kAdd:
            if (__builtin_add_overflow(a, b, &r)) return overflow(p, op, a, b);
            break;
          case OpCode::kSub:
            if (__builtin_sub_overflow(a, b, &r)) return overflow(p, op, a, b);
            break;
          case OpCode::kMul:
            if (__builtin_mul_overflow(a, b, &r)) return overflow(p, op, a, b);
            break;
          case OpCode::kDiv:
            if (b == 0) return op_error(StatusCode::kInvalidArgument, p, op, "division by zero");
            if (a == kMin && b == -1) return overflow(p, op, a, b);
            r = a / b;
            break;
          case OpCode::kMod:
            if (b == 0) return op_error(StatusCode::kInvalidArgument, p, op, "modulo by zero");
            r = b == -1 ? 0 : a % b;   // INT64_MIN % -1 traps on x86; the answer is 0
            break;
          case OpCode::kCeilDiv:
            if (b <= 0) {
              return op_error(StatusCode::kInvalidArgument, p, op,
                              "ceil_div divisor must be positive, got " + std::to_string(b));
            }
            // Truncation already rounds negative quotients up; b >= 2 whenever a remainder
            // exists, so r < a and r + 1 cannot overflow.
            r = a / b + (a % b != 0 && a > 0 ? 1 : 0);
            break;
          case OpCode::kRoundUp: {
            if (b <= 0) {
              return op_error(StatusCode::kInvalidArgument, p, op,
                              "round_up multiple must be positive, got " + std::to_string(b));
            }
            const int64_t q = a / b + (a % b != 0 && a > 0 ? 1 : 0);
            if (__builtin_mul_overflow(q, b, &r)) return overflow(p, op, a, b);
            break;
          }
          case OpCode::kMin: r = a < b ? a : b; break;
          case OpCode::kMax: r = a > b ? a : b; break;
          default:
            return internal_error(header(p.text) + "corrupt program (opcode " +
                                  std::to_string(static_cast<int>(op.code)) + ")");
        }
        a = r;
        break;
      }
    }
  }
  return stack[0];
}

// ---- parser ------------------------------------------------------------------------------------

enum class Tok : uint8_t { kEnd, kInt, kName, kLParen, kRParen, kComma, kPlus, kMinus, kStar,
                           kSlash, kPercent, kBad };

struct Token {
  Tok kind = Tok::kEnd;
  size_t at = 0;
  size_t len = 0;
  uint64_t magnitude = 0;   // kInt: the literal's value
  bool too_big = false;     // kInt: above 2^63, too big even as a negative literal
};

enum class Fn : uint8_t { kCeilDiv, kRoundUp, kMin, kMax, kClamp, kSelect };

struct FnInfo {
  std::string_view name;
  Fn fn;
  size_t arity;   // exact; min/max take at least 2
};
constexpr std::array<FnInfo, 6> kFunctions{{
    {"ceil_div", Fn::kCeilDiv, 2}, {"clamp", Fn::kClamp, 3}, {"max", Fn::kMax, 2},
    {"min", Fn::kMin, 2},          {"round_up", Fn::kRoundUp, 2}, {"select", Fn::kSelect, 3},
}};
constexpr std::string_view kFunctionList = "ceil_div, clamp, max, min, round_up, select";

const FnInfo* find_function(std::string_view name) {
  for (const FnInfo& f : kFunctions) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Parser {
 public:
  Parser(std::string_view text, Program& out) : text_(text), out_(out) {}

  Status parse() {
    KFORGE_RETURN_IF_ERROR(advance());
    if (cur_.kind == Tok::kEnd) return invalid_argument(header(text_) + "empty expression");
    size_t begin = 0;
    KFORGE_RETURN_IF_ERROR(parse_expr(begin));
    if (cur_.kind != Tok::kEnd) {
      return error_at_cur(cur_.kind == Tok::kRParen ? " (no '(' to match)"
                                                    : " (expected an operator or the end)");
    }
    if (sp_ != 1) return internal_error(header(text_) + "unbalanced program");
    return Status();
  }

 private:
  // ---- lexing
  Status advance() {
    size_t i = prev_end_ = cur_.at + cur_.len;
    while (i < text_.size() &&
           (text_[i] == ' ' || text_[i] == '\t' || text_[i] == '\n' || text_[i] == '\r')) {
      ++i;
    }
    cur_ = Token{};
    cur_.at = i;
    if (i == text_.size()) return Status();
    const char c = text_[i];
    cur_.len = 1;
    switch (c) {
      case '(': cur_.kind = Tok::kLParen; return Status();
      case ')': cur_.kind = Tok::kRParen; return Status();
      case ',': cur_.kind = Tok::kComma; return Status();
      case '+': cur_.kind = Tok::kPlus; return Status();
      case '-': cur_.kind = Tok::kMinus; return Status();
      case '*': cur_.kind = Tok::kStar; return Status();
      case '/': cur_.kind = Tok::kSlash; return Status();
      case '%': cur_.kind = Tok::kPercent; return Status();
      default: break;
    }
    if (is_digit(c)) {
      cur_.kind = Tok::kInt;
      size_t j = i;
      constexpr uint64_t kLimit = uint64_t{1} << 63;   // |INT64_MIN|
      while (j < text_.size() && is_digit(text_[j])) {
        const uint64_t d = static_cast<uint64_t>(text_[j] - '0');
        if (cur_.magnitude > (kLimit - d) / 10) {
          cur_.too_big = true;
        } else {
          cur_.magnitude = cur_.magnitude * 10 + d;
        }
        ++j;
      }
      cur_.len = j - i;
      return Status();
    }
    if (is_name_start(c)) {
      size_t j = i + 1;
      while (j < text_.size() && (is_name_start(text_[j]) || is_digit(text_[j]))) ++j;
      cur_.kind = Tok::kName;
      cur_.len = j - i;
      return Status();
    }
    cur_.kind = Tok::kBad;
    return error_at_cur();
  }

  std::string describe(const Token& t) const {
    switch (t.kind) {
      case Tok::kEnd: return "end of expression";
      case Tok::kBad: {
        const auto c = static_cast<unsigned char>(text_[t.at]);
        if (c >= 0x20 && c <= 0x7e) return "character '" + std::string(1, static_cast<char>(c)) + "'";
        static constexpr char kHex[] = "0123456789abcdef";
        return std::string("byte 0x") + kHex[c >> 4] + kHex[c & 15];
      }
      default: {
        std::string_view s = text_.substr(t.at, t.len);
        if (s.size() > 32) return "'" + std::string(s.substr(0, 32)) + "...'";
        return "'" + std::string(s) + "'";
      }
    }
  }

  // "unexpected <token> at column N<detail>"
  Status error_at_cur(std::string_view detail = {}) const {
    return located(StatusCode::kInvalidArgument, text_, "unexpected " + describe(cur_), cur_.at, detail);
  }

  // ---- emission
  Status emit(OpCode code, size_t begin, size_t at, int64_t imm, int stack_delta) {
    Op op;
    op.code = code;
    op.begin = static_cast<uint16_t>(begin);
    op.end = static_cast<uint16_t>(prev_end_);
    op.at = static_cast<uint16_t>(at);
    op.imm = imm;
    out_.ops.push_back(op);
    sp_ = static_cast<size_t>(static_cast<int64_t>(sp_) + stack_delta);
    if (sp_ > kStackCapacity) {
      return located(StatusCode::kOutOfRange, text_,
                     "expression needs more than " + std::to_string(kStackCapacity) +
                         " stack slots",
                     at);
    }
    return Status();
  }

  Status enter(size_t at) {
    if (++depth_ > LaunchExpr::kMaxDepth) {
      return located(StatusCode::kOutOfRange, text_,
                     "nesting deeper than " + std::to_string(LaunchExpr::kMaxDepth), at);
    }
    return Status();
  }

  // ---- grammar (see the header); each sets `begin` to where its sub-expression starts
  Status parse_expr(size_t& begin) {
    KFORGE_RETURN_IF_ERROR(parse_term(begin));
    while (cur_.kind == Tok::kPlus || cur_.kind == Tok::kMinus) {
      const OpCode code = cur_.kind == Tok::kPlus ? OpCode::kAdd : OpCode::kSub;
      const size_t at = cur_.at;
      KFORGE_RETURN_IF_ERROR(advance());
      size_t rhs = 0;
      KFORGE_RETURN_IF_ERROR(parse_term(rhs));
      KFORGE_RETURN_IF_ERROR(emit(code, begin, at, 0, -1));
    }
    return Status();
  }

  Status parse_term(size_t& begin) {
    KFORGE_RETURN_IF_ERROR(parse_unary(begin));
    while (cur_.kind == Tok::kStar || cur_.kind == Tok::kSlash || cur_.kind == Tok::kPercent) {
      const OpCode code = cur_.kind == Tok::kStar    ? OpCode::kMul
                          : cur_.kind == Tok::kSlash ? OpCode::kDiv
                                                     : OpCode::kMod;
      const size_t at = cur_.at;
      KFORGE_RETURN_IF_ERROR(advance());
      size_t rhs = 0;
      KFORGE_RETURN_IF_ERROR(parse_unary(rhs));
      KFORGE_RETURN_IF_ERROR(emit(code, begin, at, 0, -1));
    }
    return Status();
  }

  Status parse_unary(size_t& begin) {
    if (cur_.kind != Tok::kMinus) return parse_primary(begin);
    begin = cur_.at;
    KFORGE_RETURN_IF_ERROR(advance());
    if (cur_.kind == Tok::kInt) {
      // A negative literal, so that INT64_MIN can be written. Folding is exact: nothing binds
      // tighter than unary minus.
      if (cur_.too_big) return literal_too_big(begin);
      const int64_t v = cur_.magnitude == (uint64_t{1} << 63)
                            ? std::numeric_limits<int64_t>::min()
                            : -static_cast<int64_t>(cur_.magnitude);
      KFORGE_RETURN_IF_ERROR(advance());
      return emit(OpCode::kConst, begin, begin, v, +1);
    }
    KFORGE_RETURN_IF_ERROR(enter(begin));
    size_t inner = 0;
    KFORGE_RETURN_IF_ERROR(parse_unary(inner));
    --depth_;
    return emit(OpCode::kNeg, begin, begin, 0, 0);
  }

  Status literal_too_big(size_t at) const {
    return located(StatusCode::kOutOfRange, text_,
                   "integer literal " + std::string(text_.substr(at, cur_.at + cur_.len - at)) +
                       " does not fit in int64",
                   at);
  }

  Status parse_primary(size_t& begin) {
    begin = cur_.at;
    switch (cur_.kind) {
      case Tok::kInt: {
        if (cur_.too_big || cur_.magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return literal_too_big(cur_.at);
        }
        const auto v = static_cast<int64_t>(cur_.magnitude);
        KFORGE_RETURN_IF_ERROR(advance());
        return emit(OpCode::kConst, begin, begin, v, +1);
      }
      case Tok::kName: {
        const std::string_view name = text_.substr(cur_.at, cur_.len);
        KFORGE_RETURN_IF_ERROR(advance());
        const FnInfo* fn = find_function(name);
        if (cur_.kind == Tok::kLParen) {
          if (fn == nullptr) {
            return located(StatusCode::kInvalidArgument, text_,
                           "unknown function '" + std::string(name) + "'", begin,
                           " (known: " + std::string(kFunctionList) + ")");
          }
          return parse_call(*fn, begin);
        }
        if (fn != nullptr) {
          return located(StatusCode::kInvalidArgument, text_,
                         "function '" + std::string(name) + "' without arguments", begin,
                         " (expected '(')");
        }
        return emit(OpCode::kLoad, begin, begin, name_index(name, begin), +1);
      }
      case Tok::kLParen: {
        KFORGE_RETURN_IF_ERROR(enter(begin));
        KFORGE_RETURN_IF_ERROR(advance());
        size_t inner = 0;
        KFORGE_RETURN_IF_ERROR(parse_expr(inner));
        if (cur_.kind != Tok::kRParen) {
          return error_at_cur(" (expected ')' to match the '(' at column " + std::to_string(begin + 1) + ")");
        }
        --depth_;
        // The enclosing operator's span runs from `begin` to prev_end_, parentheses included.
        return advance();
      }
      default: return error_at_cur();
    }
  }

  // `fn` '(' args ')'; cur_ is the '('.
  Status parse_call(const FnInfo& fn, size_t begin) {
    KFORGE_RETURN_IF_ERROR(enter(cur_.at));
    const size_t open = cur_.at;
    KFORGE_RETURN_IF_ERROR(advance());
    const bool variadic = fn.fn == Fn::kMin || fn.fn == Fn::kMax;
    const std::string takes = " (" + std::string(fn.name) + " takes " + (variadic ? "at least " : "") +
                              std::to_string(fn.arity) + " arguments";
    // After argument `got`: either a ',' for another one or the closing ')'.
    auto separator = [&](size_t got, bool& done) -> Status {
      if (cur_.kind == Tok::kComma) {
        if (!variadic && got == fn.arity) return error_at_cur(takes + ")");
        done = false;
        return advance();
      }
      if (cur_.kind == Tok::kRParen) {
        if (got < fn.arity) return error_at_cur(takes + ", found " + std::to_string(got) + ")");
        done = true;
        return Status();
      }
      if (cur_.kind == Tok::kEnd) {
        return error_at_cur(" (expected ')' to match the '(' at column " + std::to_string(open + 1) + ")");
      }
      return error_at_cur(" (expected ',' or ')' in " + std::string(fn.name) + "())");
    };

    size_t arg_begin = 0;
    bool done = false;
    if (fn.fn == Fn::kSelect) {
      // c JZ(else) a JMP(end) else: b end:   — only the chosen branch runs.
      KFORGE_RETURN_IF_ERROR(parse_expr(arg_begin));
      KFORGE_RETURN_IF_ERROR(separator(1, done));
      const size_t jz = out_.ops.size();
      KFORGE_RETURN_IF_ERROR(emit(OpCode::kJumpIfZero, begin, begin, 0, -1));
      KFORGE_RETURN_IF_ERROR(parse_expr(arg_begin));
      KFORGE_RETURN_IF_ERROR(separator(2, done));
      const size_t jmp = out_.ops.size();
      // The jump pops nothing; the -1 rewinds the simulated stack to where the else branch starts.
      KFORGE_RETURN_IF_ERROR(emit(OpCode::kJump, begin, begin, 0, -1));
      out_.ops[jz].imm = static_cast<int64_t>(out_.ops.size());
      KFORGE_RETURN_IF_ERROR(parse_expr(arg_begin));
      KFORGE_RETURN_IF_ERROR(separator(3, done));
      out_.ops[jmp].imm = static_cast<int64_t>(out_.ops.size());
    } else {
      size_t got = 0;
      while (!done) {
        KFORGE_RETURN_IF_ERROR(parse_expr(arg_begin));
        ++got;
        if (variadic && got >= 2) {
          KFORGE_RETURN_IF_ERROR(
              emit(fn.fn == Fn::kMin ? OpCode::kMin : OpCode::kMax, begin, begin, 0, -1));
        }
        KFORGE_RETURN_IF_ERROR(separator(got, done));
      }
    }
    --depth_;
    KFORGE_RETURN_IF_ERROR(advance());   // past ')'; prev_end_ now ends the call
    switch (fn.fn) {
      case Fn::kCeilDiv: return emit(OpCode::kCeilDiv, begin, begin, 0, -1);
      case Fn::kRoundUp: return emit(OpCode::kRoundUp, begin, begin, 0, -1);
      case Fn::kClamp: return emit(OpCode::kClamp, begin, begin, 0, -2);
      case Fn::kMin:
      case Fn::kMax:
      case Fn::kSelect: return Status();
    }
    return Status();
  }

  int64_t name_index(std::string_view name, size_t at) {
    for (size_t i = 0; i < out_.names.size(); ++i) {
      if (out_.names[i] == name) return static_cast<int64_t>(i);
    }
    out_.names.emplace_back(name);
    out_.name_at.push_back(static_cast<uint16_t>(at));
    return static_cast<int64_t>(out_.names.size() - 1);
  }

  std::string_view text_;
  Program& out_;
  Token cur_;
  size_t prev_end_ = 0;   // end of the last consumed token
  size_t depth_ = 0;
  size_t sp_ = 0;         // stack depth after the ops emitted so far
};

}  // namespace

// ---- LaunchExpr --------------------------------------------------------------------------------

StatusOr<LaunchExpr> LaunchExpr::parse(std::string_view text) {
  if (text.size() > kMaxTextLength) {
    return out_of_range(header(text) + "expression of " + std::to_string(text.size()) +
                        " bytes exceeds the limit of " + std::to_string(kMaxTextLength));
  }
  auto p = std::make_shared<Program>();
  p->text = std::string(text);
  Parser parser(p->text, *p);
  KFORGE_RETURN_IF_ERROR(parser.parse());
  p->ops.shrink_to_fit();
  return LaunchExpr(std::move(p));
}

const std::string& LaunchExpr::text() const noexcept { return program_->text; }

std::vector<std::string> LaunchExpr::names() const { return program_->names; }

StatusOr<int64_t> LaunchExpr::evaluate(const SizeMap& sizes) const {
  const Program& p = *program_;
  // Every name must exist before anything runs, even in an untaken select branch, so that this
  // agrees with bind() (which must resolve every name up front).
  for (size_t i = 0; i < p.names.size(); ++i) {
    if (sizes.find(p.names[i]) == sizes.end()) {
      std::vector<std::string_view> keys;
      keys.reserve(sizes.size());
      for (const auto& [k, v] : sizes) keys.push_back(k);
      return unknown_name(p, i, keys);
    }
  }
  return run(p, p.ops, [&](size_t i) { return sizes.find(p.names[i])->second; });
}

StatusOr<BoundExpr> LaunchExpr::bind(const std::vector<std::string>& slot_names) const {
  const Program& p = *program_;
  std::vector<size_t> slot_of(p.names.size());
  size_t slot_count = 0;
  for (size_t i = 0; i < p.names.size(); ++i) {
    auto it = std::find(slot_names.begin(), slot_names.end(), p.names[i]);
    if (it == slot_names.end()) return unknown_name(p, i, slot_names);
    slot_of[i] = static_cast<size_t>(it - slot_names.begin());
    slot_count = std::max(slot_count, slot_of[i] + 1);
  }
  auto b = std::make_shared<Bound>();
  b->program = program_;
  b->ops = p.ops;
  for (Op& op : b->ops) {
    if (op.code == OpCode::kLoad) op.imm = static_cast<int64_t>(slot_of[static_cast<size_t>(op.imm)]);
  }
  b->slot_count = slot_count;
  return BoundExpr(std::move(b));
}

// ---- BoundExpr ---------------------------------------------------------------------------------

const std::string& BoundExpr::text() const noexcept { return bound_->program->text; }

StatusOr<int64_t> BoundExpr::evaluate(std::span<const int64_t> slots) const {
  const Bound& b = *bound_;
  if (slots.size() < b.slot_count) {
    return invalid_argument(header(b.program->text) + "bound to " + std::to_string(b.slot_count) +
                            " slots, evaluated with " + std::to_string(slots.size()) + " values");
  }
  return run(*b.program, b.ops, [&](size_t i) { return slots[i]; });
}

}  // namespace kforge
