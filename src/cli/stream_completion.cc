// stream_completion.cc — see stream_completion.h.
#include "cli/stream_completion.h"

#include <chrono>
#include <optional>
#include <string>

#include "os/clock.h"
#include "router/sse_splitter.h"

namespace kvrelay::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t MonoNs() {  // steady_clock is CLOCK_MONOTONIC, as D's pull log
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<Streamed> StreamCompletion(const http::Client& cli, const json& body, double timeout_s) {
  Streamed out;
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/v1/completions";
  req.body = body.dump();
  int status = 0;
  router::SseSplitter sse;  // the router's: events however the bytes were chunked
  std::string error;
  bool done = false;
  const Clock::time_point t0 = Clock::now();
  http::ClientSink sink;
  sink.on_status = [&](int s) { status = s; };
  sink.on_data = [&](std::string_view data) {
    sse.Feed(data);
    while (std::optional<std::string> ev = sse.Next()) {
      const std::optional<std::string> data_line = router::SseSplitter::DataOf(*ev);
      if (!data_line) continue;  // a keep-alive comment
      if (*data_line == "[DONE]") {
        done = true;
        continue;
      }
      const json j = json::parse(*data_line, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error") && !j["error"].is_null()) {
        error = j["error"].is_object() ? j["error"].value("message", "error") : j["error"].dump();
        continue;
      }
      const json choices = j.value("choices", json::array());
      if (choices.empty()) continue;   // the usage chunk
      const json ids = choices[0].value("token_ids", json::array());
      const json vers = choices[0].value("weights_versions", json::array());
      if (out.ttft_s < 0 && !ids.empty()) {
        out.ttft_s = SecondsSince(t0);
        out.first_token_mono_ns = MonoNs();
      }
      const double at_s = SecondsSince(t0);
      for (size_t k = 0; k < ids.size() && k < vers.size(); ++k) {
        out.token_s.push_back(at_s);
        out.tokens.push_back(
            engine::TokenOut{0, ids[k].get<engine::Token>(), vers[k].get<uint64_t>()});
      }
    }
    return SecondsSince(t0) < timeout_s;
  };
  http::ClientOptions opts = cli.options();
  opts.idle_timeout = Duration::Nanoseconds(static_cast<int64_t>(timeout_s * 1e9));
  http::BlockingCall call;
  Result<http::ClientResponse> r = call.Run(cli.base_url(), std::move(req), opts, std::move(sink));
  if (!r.ok() && status == 0) return UnavailableError("no response: " + r.status().message());
  if (status != 200) {
    return UnavailableError("HTTP " + std::to_string(status) + ": " +
                            (r.ok() ? r->body.substr(0, 300) : r.status().message()));
  }
  if (!error.empty()) return UnavailableError("error event: " + error);
  if (!done) {
    return UnavailableError(SecondsSince(t0) >= timeout_s ? "timed out"
                                                          : "stream cut off before [DONE]");
  }
  if (out.ttft_s < 0) return UnavailableError("no token");
  return out;
}

}  // namespace kvrelay::cli
