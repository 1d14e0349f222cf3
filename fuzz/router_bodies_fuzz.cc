// router_bodies_fuzz.cc — libFuzzer target for every body the router
// parses (src/router/): the client's POST /v1/completions body
// (ParseClientBody) and the two leg bodies built from it, an engine's
// GET /kv_info answer (ParseEngineInfo), the legs' answers (JudgeCompletion,
// UpstreamErrorMessage) and D's SSE stream (SseSplitter, cut at the
// input's own bytes).
//
// Beyond "never crashes": a leg body is a JSON object whose
// kv_transfer_params is the router's own, whatever the client sent; the SSE
// splitter yields the same events however the bytes are chunked.
// Seeds: fuzz/corpus/router_bodies; dictionary: router_bodies.dict.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "router/engine_info.h"
#include "router/leg_bodies.h"
#include "router/sse_splitter.h"

namespace {

using nlohmann::json;
using namespace kvrelay::router;

std::vector<std::string> Events(std::string_view bytes, size_t chunk) {
  SseSplitter s;
  std::vector<std::string> out;
  for (size_t at = 0; at < bytes.size(); at += chunk) {
    s.Feed(bytes.substr(at, chunk));
    while (std::optional<std::string> e = s.Next()) out.push_back(std::move(*e));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);

  const kvrelay::Result<ClientRequest> client = ParseClientBody(body);
  if (client.ok()) {
    KV_CHECK(client->body.is_object());
    const kvrelay::TransferId t{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
    EngineInfo p;
    p.engine_id = 7;
    p.kv_host = "10.0.0.1";
    p.kv_port = 9100;
    p.tp = 2;
    const json pb = json::parse(PrefillLegBody(client->body, t, 4), nullptr, false);
    KV_CHECK(pb.is_object());
    KV_CHECK(pb.at("max_tokens") == 1 && pb.at("stream") == false);
    KV_CHECK(pb.at("kv_transfer_params").at("transfer_id") == t.ToString());
    KV_CHECK(pb.at("kv_transfer_params").size() == 3);
    const json db = json::parse(DecodeLegBody(client->body, t, p), nullptr, false);
    KV_CHECK(db.is_object());
    KV_CHECK(db.at("kv_transfer_params").at("remote_port") == 9100);
    KV_CHECK(db.at("kv_transfer_params").size() == 6);
  } else {
    KV_CHECK(client.status().code() == kvrelay::StatusCode::kInvalidArgument);
  }

  const kvrelay::Result<EngineInfo> info = ParseEngineInfo(body);
  if (info.ok()) {
    const kvrelay::Result<EngineInfo> again = ParseEngineInfo(info->ToJson().dump());
    KV_CHECK(again.ok() && *again == *info);
  }
  (void)JudgeCompletion(body);
  KV_CHECK(!UpstreamErrorMessage(body).empty());

  const std::vector<std::string> whole = Events(body, body.size() + 1);
  const size_t chunk = size == 0 ? 1 : 1 + data[0] % 7;
  KV_CHECK(Events(body, chunk) == whole);
  for (const std::string& e : whole) (void)SseSplitter::DataOf(e);
  return 0;
}
