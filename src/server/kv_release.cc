#include "server/kv_release.h"

#include <nlohmann/json.hpp>

#include "server/json_body.h"

namespace kvrelay::server {

Result<TransferId> ParseKvRelease(std::string_view body) {
  Result<nlohmann::json> j = ParseJsonBody(body);
  if (!j.ok()) return j.status();
  if (!j->is_object()) {
    return InvalidArgumentError("body must be a JSON object {\"transfer_id\": \"<32 hex>\"}");
  }
  for (const auto& [key, value] : j->items()) {
    if (key != "transfer_id") {
      return InvalidArgumentError("unknown field \"" + key + "\" (only transfer_id is taken)");
    }
  }
  auto it = j->find("transfer_id");
  if (it == j->end() || !it->is_string()) {
    return InvalidArgumentError("transfer_id is required: 32 lowercase hex digits");
  }
  TransferId transfer;
  const std::string& text = it->get_ref<const std::string&>();
  if (!TransferId::Parse(text, &transfer)) {
    return InvalidArgumentError("transfer_id must be 32 lowercase hex digits, got \"" +
                                text.substr(0, 64) + "\"");
  }
  if (transfer.IsZero()) return InvalidArgumentError("transfer_id must not be all zeros");
  return transfer;
}

}  // namespace kvrelay::server
