#include "runtime/zmq_channel.h"

#include <zmq.h>

#include "os/log.h"

namespace kvrelay::runtime {

namespace {
void SetLimits(void* sock, const ZmqSocketLimits& limits) {
  const int zero = 0;
  zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(sock, ZMQ_SNDHWM, &limits.hwm, sizeof(int));
  zmq_setsockopt(sock, ZMQ_RCVHWM, &limits.hwm, sizeof(int));
  zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &limits.max_frame_bytes, sizeof limits.max_frame_bytes);
}
}  // namespace

Result<void*> BindRouter(void* zmq, const std::string& endpoint, const ZmqSocketLimits& limits) {
  void* router = zmq_socket(zmq, ZMQ_ROUTER);
  const int one = 1;
  zmq_setsockopt(router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  zmq_setsockopt(router, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
  SetLimits(router, limits);
  if (zmq_bind(router, endpoint.c_str()) != 0) {
    const std::string err = zmq_strerror(zmq_errno());
    zmq_close(router);
    return Status(StatusCode::kUnavailable,
                  "cannot bind control channel " + endpoint + ": " + err);
  }
  return router;
}

void* ConnectDealer(void* zmq, const std::string& endpoint, const std::string& routing_id,
                    Duration ping, Duration ping_timeout, const ZmqSocketLimits& limits) {
  void* sock = zmq_socket(zmq, ZMQ_DEALER);
  SetLimits(sock, limits);
  zmq_setsockopt(sock, ZMQ_ROUTING_ID, routing_id.data(), routing_id.size());
  const int interval_ms = 100, connect_timeout_ms = 1000;
  const int ping_ms = static_cast<int>(ping.millis());
  const int ping_timeout_ms = static_cast<int>(ping_timeout.millis());
  zmq_setsockopt(sock, ZMQ_RECONNECT_IVL, &interval_ms, sizeof interval_ms);
  zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &ping_ms, sizeof ping_ms);
  zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &ping_timeout_ms, sizeof ping_timeout_ms);
  zmq_setsockopt(sock, ZMQ_CONNECT_TIMEOUT, &connect_timeout_ms, sizeof connect_timeout_ms);
  if (zmq_connect(sock, endpoint.c_str()) != 0) {
    Log("rank", "cannot connect to %s: %s", endpoint.c_str(), zmq_strerror(zmq_errno()));
  }
  return sock;
}

uint64_t DrainRouter(void* router,
                     const std::function<void(const std::string&, const uint8_t*, size_t)>& fn) {
  uint64_t extra = 0;
  zmq_msg_t id, body;
  for (int n = 0; n < 4096; ++n) {
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, router, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&id);
      break;
    }
    const std::string identity(static_cast<const char*>(zmq_msg_data(&id)), zmq_msg_size(&id));
    zmq_msg_close(&id);
    bool more = false;
    int frames = 0;
    do {
      zmq_msg_init(&body);
      more = false;
      if (zmq_msg_recv(&body, router, 0) >= 0) {
        more = zmq_msg_more(&body) != 0;
        if (frames++ == 0) {
          fn(identity, static_cast<const uint8_t*>(zmq_msg_data(&body)), zmq_msg_size(&body));
        } else {
          ++extra;
        }
      }
      zmq_msg_close(&body);
    } while (more);
  }
  return extra;
}

void DrainDealer(void* dealer, const std::function<void(const uint8_t*, size_t)>& fn) {
  zmq_msg_t body;
  for (int n = 0; n < 4096; ++n) {
    zmq_msg_init(&body);
    if (zmq_msg_recv(&body, dealer, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&body);
      return;
    }
    fn(static_cast<const uint8_t*>(zmq_msg_data(&body)), zmq_msg_size(&body));
    zmq_msg_close(&body);
  }
}

bool SendZmqFrame(void* sock, const std::string* identity, const std::vector<uint8_t>& frame) {
  if (identity != nullptr &&
      zmq_send(sock, identity->data(), identity->size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
    return false;
  }
  return zmq_send(sock, frame.data(), frame.size(), ZMQ_DONTWAIT) >= 0;
}

}  // namespace kvrelay::runtime
