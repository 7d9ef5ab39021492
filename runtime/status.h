// Status and StatusOr<T>: how fallible kforge functions report errors without exceptions.
//
//   StatusOr<LaunchExpr> e = LaunchExpr::parse("ceil_div(numel0, 256)");
//   if (!e.ok()) { log(e.status().message()); return; }
//   int64_t blocks = e->evaluate(sizes).value();
//
// Code that runs inside the user's process (the hook) must never throw into user code, so the
// runtime reports errors as values. Both types are [[nodiscard]]: dropping an error is a compile
// warning (an error under KFORGE_WERROR).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kforge {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // the caller's input is malformed (bad expression, bad message, bad config)
  kOutOfRange,        // a value does not fit (integer overflow, size limit exceeded)
  kNotFound,          // a named thing does not exist (size name, symbol, library)
  kUnavailable,       // a resource is not present on this host (no GPU, no NVRTC)
  kInternal,          // a kforge bug or an unexpected failure of a library we call
};

std::string_view status_code_name(StatusCode code) noexcept;

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const noexcept { return code_ == StatusCode::kOk; }
  StatusCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "invalid_argument: <message>", or "ok".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T val) : v_(std::move(val)) {}                        // NOLINT: implicit by design
  StatusOr(Status status) : v_(std::move(status)) {                  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "StatusOr built from ok Status");
  }

  bool ok() const noexcept { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  // Precondition: ok(). Violations are kforge bugs; they terminate in debug and sanitizer builds.
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  T& operator*() & { return std::get<T>(v_); }
  const T& operator*() const& { return std::get<T>(v_); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace kforge

// Returns early with the status of a fallible expression.
#define KFORGE_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::kforge::Status kforge_status_ = (expr);   \
    if (!kforge_status_.ok()) return kforge_status_; \
  } while (0)

// Reads a StatusOr into `lhs` or returns its error.
#define KFORGE_ASSIGN_OR_RETURN(lhs, expr)                 \
  KFORGE_ASSIGN_OR_RETURN_IMPL_(KFORGE_CONCAT_(kforge_so_, __LINE__), lhs, expr)
#define KFORGE_CONCAT_INNER_(a, b) a##b
#define KFORGE_CONCAT_(a, b) KFORGE_CONCAT_INNER_(a, b)
#define KFORGE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
