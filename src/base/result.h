// result.h — Result<T>: a value or a non-OK Status.
//
// Why: std::expected is C++23; kvrelay is C++20 and must build with g++ 12
// and clang 14. Accessing the value of an error Result is a bug (KV_CHECK).
//
// Thread safety: a value type.
#pragma once

#include <utility>
#include <variant>

#include "base/check.h"
#include "base/status.h"

namespace kvrelay {

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    KV_CHECK_MSG(!std::get<Status>(v_).ok(), "Result from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }

  T& value() & {
    KV_CHECK_MSG(ok(), "value() of an error Result");
    return std::get<T>(v_);
  }
  const T& value() const& {
    KV_CHECK_MSG(ok(), "value() of an error Result");
    return std::get<T>(v_);
  }
  T&& value() && {
    KV_CHECK_MSG(ok(), "value() of an error Result");
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvrelay
