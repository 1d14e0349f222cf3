// refused_handoff.h — ParseRefusedHandoff: the producer a refused D leg
// named, read leniently from a body the server would not admit.
//
// Why: when D refuses a hand-off before admitting it (malformed body, a
// limit, queue full), P still holds a READY send that no pull will ever come
// for; D tells P to release it at once (EngineServer::ReleaseRefused). The
// body was refused, so only its kv_transfer_params is read, and only fields
// of exactly the right type and range are trusted: a peer's number never
// wraps into a port or tp. Pure, so the HTTP handler and
// fuzz/completion_request_fuzz.cc call the same code.
//
// Thread safety: pure function; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/connector_scheduler.h"

namespace kvrelay::server {

struct RefusedHandoff {
  KvTransferParams kv;   // transfer, remote_engine, remote_tp; do_remote_prefill
  std::string host;      // the producer's control host, non-empty
  uint16_t port = 0;     // its control base port, non-zero
};

// The hand-off `body` asks for (kv_transfer_params with do_remote_prefill:
// true, a non-zero transfer_id, remote_engine_id, remote_host, remote_port in
// 1..65535, remote_tp_size dividing engine::kHeadGroups), or nullopt.
std::optional<RefusedHandoff> ParseRefusedHandoff(std::string_view body);

}  // namespace kvrelay::server
