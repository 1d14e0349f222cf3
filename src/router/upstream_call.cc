#include "router/upstream_call.h"

#include <httplib.h>

namespace kvrelay::router {

namespace {

std::string DescribeError(httplib::Error e, const std::string& url) {
  switch (e) {
    case httplib::Error::Connection: return "cannot connect to " + url;
    case httplib::Error::ConnectionTimeout: return "connecting to " + url + " timed out";
    case httplib::Error::Read: return "the connection to " + url + " was lost (read failed)";
    case httplib::Error::Write: return "the connection to " + url + " was lost (write failed)";
    default: return "HTTP error talking to " + url + ": " + httplib::to_string(e);
  }
}

}  // namespace

LegEnd UpstreamCall::Post(const std::string& base_url, const std::string& path,
                          const std::string& body, const Sink& sink,
                          const UpstreamOptions& options) {
  LegEnd end;
  httplib::Client client(base_url);
  client.set_keep_alive(false);
  // Nagle off: the leg's head and body go in two send()s; with Nagle the
  // body waited 40 ms for the engine's delayed ACK (docs/performance.md).
  client.set_tcp_nodelay(true);
  client.set_connection_timeout(
      std::chrono::nanoseconds(options.connect_timeout.ns()));
  client.set_read_timeout(std::chrono::nanoseconds(options.idle_timeout.ns()));
  client.set_write_timeout(std::chrono::nanoseconds(options.idle_timeout.ns()));
  {
    MutexLock lock(&mu_);
    if (cancelled()) {
      end.kind = LegEnd::Kind::kCancelled;
      return end;
    }
    client_ = &client;
  }
  int status = 0;
  size_t total = 0;
  bool too_big = false, stopped = false;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    if (sink.on_status) sink.on_status(status);
    return !cancelled();
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (cancelled()) return false;
    total += len;
    if (total > options.max_body_bytes) {
      too_big = true;
      return false;
    }
    if (status == 200 && sink.on_data) {
      if (!sink.on_data(std::string_view(data, len))) {
        stopped = true;
        return false;
      }
    } else {
      end.body.append(data, len);
    }
    return true;
  };
  httplib::Result r = client.send(req);
  {
    MutexLock lock(&mu_);
    client_ = nullptr;
  }
  if (cancelled() || stopped) {
    end.kind = LegEnd::Kind::kCancelled;
    end.body.clear();
    return end;
  }
  if (too_big) {
    end.kind = LegEnd::Kind::kTransportError;
    end.error = "the answer of " + base_url + " is larger than " +
                std::to_string(options.max_body_bytes) + " bytes";
    end.body.clear();
    return end;
  }
  if (!r) {
    end.kind = LegEnd::Kind::kTransportError;
    end.error = DescribeError(r.error(), base_url);
    end.connection_failed = true;
    end.status = status;
    return end;
  }
  end.kind = LegEnd::Kind::kResponse;
  end.status = r->status;
  return end;
}

void UpstreamCall::Cancel() {
  cancelled_.store(true, std::memory_order_release);
  MutexLock lock(&mu_);
  if (client_ != nullptr) client_->stop();
}

}  // namespace kvrelay::router
