// upstream_call.h — UpstreamCall: one HTTP POST from the router to an
// engine, run on the calling thread, that any other thread can cancel at
// once.
//
// Why: a hand-off has two legs in flight together, and either's failure (or
// the client leaving) must stop the other promptly: the engines abort a
// request whose client disconnects, so closing the leg's connection is how
// the router cancels it. Cancel() shuts the socket down (httplib's
// Client::stop()); a cancel that races with connecting is caught by the
// response and content callbacks, which check the flag on every call (the
// engines write a byte at least every probe period while a request runs).
//
// Body bytes of a 200 answer go to `on_data` as they arrive when it is set
// (D's stream); otherwise, and for any other status, the body is collected
// and returned (up to max_body_bytes; more is a transport error).
//
// Owner: Relay, one per leg. Threading: Post() on the leg's thread, once;
// Cancel() from any thread, any number of times, before, during or after
// Post(). Callbacks run on Post()'s thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "base/mutex.h"
#include "base/time.h"
#include "router/relay_logic.h"

namespace httplib {
class Client;
}

namespace kvrelay::router {

struct UpstreamOptions {
  Duration connect_timeout = Duration::Seconds(3);
  // The longest silence tolerated while reading an answer (the engines write
  // at least every 200 ms while a request runs).
  Duration idle_timeout = Duration::Seconds(60);
  size_t max_body_bytes = size_t{16} << 20;
};

class UpstreamCall {
 public:
  struct Sink {
    std::function<void(int status)> on_status;        // may be empty
    std::function<bool(std::string_view)> on_data;    // 200 body; false: stop
  };

  // POSTs `body` (JSON) to base_url + path. A stop asked by on_data, or a
  // Cancel(), ends as kCancelled.
  LegEnd Post(const std::string& base_url, const std::string& path, const std::string& body,
              const Sink& sink, const UpstreamOptions& options) EXCLUDES(mu_);
  void Cancel() EXCLUDES(mu_);
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> cancelled_{false};
  Mutex mu_;
  httplib::Client* client_ GUARDED_BY(mu_) = nullptr;   // set during Post()
};

}  // namespace kvrelay::router
