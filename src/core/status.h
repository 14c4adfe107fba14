// Two error tiers (DESIGN.md §4):
//  - bugs abort with statement, file and line: LS_CHECK(cond) / LS_CHECK_MSG(cond, msg);
//  - expected failures (bad file, unsupported checkpoint, over budget, out of memory)
//    travel as values: Status (ok or an Error) and Expected<T> (a T or an Error),
//    with a message a user can act on.
// C++20 has no std::expected, so Expected<T> is a small tagged union of our own.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace ls {

enum class ErrorCode {
  invalid_argument,  // the caller asked for something malformed (flag, shape, dtype)
  invalid_file,      // a file is malformed or inconsistent
  io,                // the operating system refused a read or write
  unsupported,       // well-formed but not something we implement
  out_of_budget,     // a plan does not fit the memory budget
  out_of_memory,     // an allocation failed
  device,            // a device (CUDA, cuBLAS, cuDNN) call failed
  not_found,         // a named thing is absent
  nonfinite,         // a computed value is NaN or infinite (bad weights, inputs or settings)
};

const char* to_string(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::invalid_argument;
  std::string message;
};

// A Status is ok or holds an Error. [[nodiscard]] so that a dropped failure warns.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : error_(std::move(e)), ok_(false) {}  // NOLINT: implicit on purpose
  static Status ok_status() { return Status(); }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }
  const std::string& message() const { return error_.message; }

 private:
  Error error_;
  bool ok_ = true;
};

inline Error make_error(ErrorCode code, std::string message) { return Error{code, std::move(message)}; }

template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}       // NOLINT: implicit on purpose
  Expected(Error error) : v_(std::move(error)) {}   // NOLINT
  Expected(Status status) : v_(status.error()) {    // NOLINT: only from a failed Status
    if (status.ok()) { std::fprintf(stderr, "Expected built from an ok Status\n"); std::abort(); }
  }
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }
  Status status() const { return ok() ? Status() : Status(error()); }

 private:
  std::variant<T, Error> v_;
};

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace ls

#define LS_CHECK(cond) \
  do { if (!(cond)) ::ls::check_failed(#cond, __FILE__, __LINE__, std::string()); } while (0)
#define LS_CHECK_MSG(cond, msg) \
  do { if (!(cond)) ::ls::check_failed(#cond, __FILE__, __LINE__, (msg)); } while (0)

// Propagate a failed Status / Expected out of a function returning Status or Expected.
#define LS_TRY(expr)                                   \
  do {                                                 \
    auto ls_try_status_ = (expr);                      \
    if (!ls_try_status_.ok()) return ls_try_status_.error(); \
  } while (0)

#define LS_CONCAT_INNER(a, b) a##b
#define LS_CONCAT(a, b) LS_CONCAT_INNER(a, b)
// LS_ASSIGN_OR_RETURN(auto x, f()) : x = value of f(), or return its error.
#define LS_ASSIGN_OR_RETURN(lhs, expr) LS_ASSIGN_OR_RETURN_IMPL(LS_CONCAT(ls_tmp_, __LINE__), lhs, expr)
#define LS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.error();             \
  lhs = std::move(tmp).value()
