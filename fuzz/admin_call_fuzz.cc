// admin_call_fuzz.cc — libFuzzer target for the engine server's admin
// endpoints: the query string (split and decoded by http::SplitTarget, as
// the server receives it) and the body, through ParseAdminRequest
// (server/admin_call.h), exactly what the handler calls.
//
// Input: "<path>\n<query string>\n<body>". A path that is not an admin path
// is mapped onto one by its first byte, so most inputs reach a parser.
// Accepted calls must keep the header's rules (sleep level 0..2, weights
// version >= 1, abort_requests ids only when not "all"). Seeds:
// fuzz/corpus/admin_call; dictionary: admin_call.dict.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/check.h"
#include "http/http_request.h"
#include "server/admin_call.h"

namespace {

using namespace kvrelay::server;

struct Checker {
  void operator()(const SleepCall& c) const { KV_CHECK(c.level <= 2); }
  void operator()(const UpdateWeightsCall& c) const { KV_CHECK(c.version >= 1); }
  void operator()(const AbortRequestsCall& c) const {
    KV_CHECK(!c.all || c.request_ids.empty());
  }
  template <typename T>
  void operator()(const T&) const {}
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl1 = in.find('\n');
  if (nl1 == std::string_view::npos) return 0;
  const size_t nl2 = in.find('\n', nl1 + 1);
  std::string path(in.substr(0, nl1));
  const std::string query(in.substr(nl1 + 1, nl2 == std::string_view::npos ? std::string_view::npos
                                                                          : nl2 - nl1 - 1));
  const std::string_view body =
      nl2 == std::string_view::npos ? std::string_view() : in.substr(nl2 + 1);
  const auto& paths = AdminPaths();
  bool known = false;
  for (std::string_view p : paths) known = known || p == path;
  if (!known && !path.empty()) {
    path = std::string(paths[static_cast<uint8_t>(path[0]) % paths.size()]);
  }

  std::string split_path;
  std::multimap<std::string, std::string> params;
  if (!kvrelay::http::SplitTarget(path + "?" + query, &split_path, &params)) return 0;
  const kvrelay::Result<AdminCall> call = ParseAdminRequest(path, params, body);
  if (!call.ok()) {
    KV_CHECK(!call.status().message().empty());
    KV_CHECK(call.status().code() == kvrelay::StatusCode::kInvalidArgument ||
             call.status().code() == kvrelay::StatusCode::kNotFound);
    return 0;
  }
  std::visit(Checker{}, *call);
  KV_CHECK("/" + std::string(AdminCallName(*call)) == path);
  return 0;
}
