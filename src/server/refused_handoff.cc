// refused_handoff.cc — see refused_handoff.h.
#include "server/refused_handoff.h"

#include <limits>

#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "server/completion_request.h"

namespace kvrelay::server {

using nlohmann::json;

namespace {

// An unsigned JSON integer no larger than `max`, or nullopt.
std::optional<uint64_t> Unsigned(const json& obj, const char* key, uint64_t max) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_unsigned()) return std::nullopt;
  const uint64_t v = it->get<uint64_t>();
  if (v > max) return std::nullopt;
  return v;
}

}  // namespace

std::optional<RefusedHandoff> ParseRefusedHandoff(std::string_view body) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto kit = j.find("kv_transfer_params");
  if (kit == j.end() || !kit->is_object()) return std::nullopt;
  const json& k = *kit;
  auto flag = k.find("do_remote_prefill");
  if (flag == k.end() || !flag->is_boolean() || !flag->get<bool>()) return std::nullopt;
  RefusedHandoff h;
  h.kv.do_remote_prefill = true;
  auto id = k.find("transfer_id");
  if (id == k.end() || !id->is_string() ||
      !TransferId::Parse(id->get_ref<const std::string&>(), &h.kv.transfer) ||
      h.kv.transfer.IsZero()) {
    return std::nullopt;
  }
  auto host = k.find("remote_host");
  if (host == k.end() || !host->is_string() || host->get_ref<const std::string&>().empty() ||
      host->get_ref<const std::string&>().size() > kMaxRemoteHostChars) {
    return std::nullopt;
  }
  h.host = host->get<std::string>();
  const auto engine = Unsigned(k, "remote_engine_id", std::numeric_limits<uint32_t>::max());
  const auto port = Unsigned(k, "remote_port", std::numeric_limits<uint16_t>::max());
  const auto tp = Unsigned(k, "remote_tp_size", engine::kHeadGroups);
  if (!engine || !port || *port == 0 || !tp || *tp == 0 || engine::kHeadGroups % *tp != 0) {
    return std::nullopt;
  }
  h.kv.remote_engine = static_cast<uint32_t>(*engine);
  h.port = static_cast<uint16_t>(*port);
  h.kv.remote_tp = static_cast<uint32_t>(*tp);
  return h;
}

}  // namespace kvrelay::server
