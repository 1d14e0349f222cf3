// status.h — Status: the outcome of an operation that can fail for reasons
// outside the program's control (bad input, a peer gone, a deadline passed).
//
// Why: one error convention across the project. Codes follow the canonical
// set (as in abseil/gRPC) so that a transfer failure reads the same in a log,
// on the wire and in a metric. Bugs are not Statuses: they are KV_CHECKs.
//
// Thread safety: a value type; distinct objects may be used from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace kvrelay {

enum class StatusCode : uint8_t {
  kOk = 0,
  kCancelled = 1,           // the caller or a peer withdrew the work
  kInvalidArgument = 3,     // input is malformed regardless of state
  kDeadlineExceeded = 4,    // a deadline passed before the work finished
  kNotFound = 5,            // the named entity does not exist
  kAlreadyExists = 6,       // a live entity with that name exists
  kResourceExhausted = 8,   // a bound (queue, pool) is full
  kFailedPrecondition = 9,  // the system is not in a state that allows this
  kAborted = 10,            // the work was ended by an abort
  kOutOfRange = 11,
  kInternal = 13,
  kUnavailable = 14,        // a peer or transport cannot be reached now
  kDataLoss = 15,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Explicitly discards a status the caller has decided not to act on.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status CancelledError(std::string m) {
  return Status(StatusCode::kCancelled, std::move(m));
}
inline Status InvalidArgumentError(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status DeadlineExceededError(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
inline Status NotFoundError(std::string m) {
  return Status(StatusCode::kNotFound, std::move(m));
}
inline Status AlreadyExistsError(std::string m) {
  return Status(StatusCode::kAlreadyExists, std::move(m));
}
inline Status ResourceExhaustedError(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
inline Status FailedPreconditionError(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status AbortedError(std::string m) {
  return Status(StatusCode::kAborted, std::move(m));
}
inline Status UnavailableError(std::string m) {
  return Status(StatusCode::kUnavailable, std::move(m));
}
inline Status DataLossError(std::string m) {
  return Status(StatusCode::kDataLoss, std::move(m));
}
inline Status InternalError(std::string m) {
  return Status(StatusCode::kInternal, std::move(m));
}

}  // namespace kvrelay
