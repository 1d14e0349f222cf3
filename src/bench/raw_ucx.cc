// raw_ucx.cc — the UCX baseline: ucp_put_nbx of every segment, then one
// ucp_ep_flush_nbx per transfer, from a worker in this process into memory
// a helper process ucp_mem_map'ed — exactly the calls kvrelay's ucx
// transport makes, without its connector, threads or locks.
//
// The endpoint asks for peer error handling, as kvrelay's does (a P/D
// transport must survive a dead peer), so UCX picks the same lanes for
// both; with UCX 1.13 on one host those are its tcp lanes. Both sides
// progress their workers by busy polling: the best case for the baseline.
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstring>

#include "bench/raw_baseline.h"
#include "bench/raw_helper.h"

namespace kvrelay::bench {
namespace {

struct Ucx {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ~Ucx() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }
};

Status InitUcx(const std::string& tls, Ucx* u) {
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) {
    return UnavailableError("ucx baseline: ucp_config_read");
  }
  if (!tls.empty() && ucp_config_modify(config, "TLS", tls.c_str()) != UCS_OK) {
    ucp_config_release(config);
    return UnavailableError("ucx baseline: bad UCX_TLS '" + tls + "'");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;
  const ucs_status_t st = ucp_init(&params, config, &u->context);
  ucp_config_release(config);
  if (st != UCS_OK) return UnavailableError(std::string("ucx baseline: ucp_init: ") + ucs_status_string(st));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucp_worker_create(u->context, &wp, &u->worker) != UCS_OK) {
    return UnavailableError("ucx baseline: ucp_worker_create");
  }
  return Status::Ok();
}

bool SendBlob(int sock, const void* p, uint32_t n) {
  return raw::SendAll(sock, &n, sizeof n) && raw::SendAll(sock, p, n);
}
bool RecvBlob(int sock, std::vector<uint8_t>* out) {
  uint32_t n = 0;
  if (!raw::RecvAll(sock, reinterpret_cast<uint8_t*>(&n), sizeof n) || n > (1u << 20)) return false;
  out->resize(n);
  return raw::RecvAll(sock, out->data(), n);
}

// Progresses `worker` until `req` completes; its status.
ucs_status_t WaitRequest(ucp_worker_h worker, ucs_status_ptr_t req) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  ucs_status_t st;
  while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) ucp_worker_progress(worker);
  ucp_request_free(req);
  return st;
}

// The receiver: maps a pool, sends its address, rkey and worker address,
// progresses until the parent says done, then hashes the last transfer.
int Receiver(int sock, const std::vector<RawTransfer>& transfers, const RawOptions& options) {
  Result<raw::Pool> dst = raw::Pool::Make(options.dst_pool_bytes);
  if (!dst.ok()) return 2;
  Ucx u;
  if (!InitUcx(options.ucx_tls, &u).ok()) return 3;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = dst->data();
  mp.length = options.dst_pool_bytes;
  ucp_mem_h memh = nullptr;
  if (ucp_mem_map(u.context, &mp, &memh) != UCS_OK) return 4;
  void* rkey = nullptr;
  size_t rkey_len = 0;
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  if (ucp_rkey_pack(u.context, memh, &rkey, &rkey_len) != UCS_OK ||
      ucp_worker_get_address(u.worker, &addr, &addr_len) != UCS_OK) {
    return 5;
  }
  const uint64_t base = reinterpret_cast<uint64_t>(dst->data());
  const bool sent = raw::SendAll(sock, &base, sizeof base) &&
                    SendBlob(sock, rkey, static_cast<uint32_t>(rkey_len)) &&
                    SendBlob(sock, addr, static_cast<uint32_t>(addr_len));
  ucp_rkey_buffer_release(rkey);
  ucp_worker_release_address(u.worker, addr);
  if (!sent) return 6;
  // Progress (tcp puts need the target's worker) until "done" arrives.
  while (true) {
    ucp_worker_progress(u.worker);
    uint8_t b;
    const ssize_t r = recv(sock, &b, 1, MSG_DONTWAIT);
    if (r == 1) break;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 7;
  }
  const uint64_t h = raw::HashDst(dst->data(), transfers.back());
  ucp_mem_unmap(u.context, memh);
  return raw::SendAll(sock, &h, sizeof h) ? 0 : 8;
}

}  // namespace

Result<std::vector<double>> RawUcxPut(const std::vector<RawTransfer>& transfers,
                                      const RawOptions& options) {
  auto child = raw::Helper::Fork(
      [&](int sock) -> int { return Receiver(sock, transfers, options); });
  if (!child.ok()) return child.status();
  uint64_t remote_base = 0;
  std::vector<uint8_t> rkey_buf, addr;
  if (!raw::RecvAll(child->sock(), reinterpret_cast<uint8_t*>(&remote_base), sizeof remote_base) ||
      !RecvBlob(child->sock(), &rkey_buf) || !RecvBlob(child->sock(), &addr)) {
    return UnavailableError("ucx baseline: the receiver did not start");
  }
  Result<raw::Pool> src = raw::Pool::Make(options.src_pool_bytes);
  if (!src.ok()) return src.status();
  Ucx u;
  if (Status s = InitUcx(options.ucx_tls, &u); !s.ok()) return s;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = src->data();
  mp.length = options.src_pool_bytes;
  ucp_mem_h memh = nullptr;
  if (ucp_mem_map(u.context, &mp, &memh) != UCS_OK) return UnavailableError("ucx baseline: ucp_mem_map");
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(addr.data());
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ucp_ep_h ep = nullptr;
  ucp_rkey_h rkey = nullptr;
  if (ucp_ep_create(u.worker, &ep_params, &ep) != UCS_OK ||
      ucp_ep_rkey_unpack(ep, rkey_buf.data(), &rkey) != UCS_OK) {
    return UnavailableError("ucx baseline: endpoint or rkey");
  }
  std::vector<double> seconds;
  seconds.reserve(transfers.size());
  Status failed = Status::Ok();
  std::vector<ucs_status_ptr_t> reqs;
  // Two passes, the second timed (see raw_baseline.cc).
  for (int pass = 0; pass < 2 && failed.ok(); ++pass) {
    for (const RawTransfer& t : transfers) {
      raw::IdleBefore(options.idle_before);
      const auto t0 = std::chrono::steady_clock::now();
      ucp_request_param_t put{};
      put.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      put.memh = memh;
      reqs.clear();
      for (const net::Segment& s : t) {
        reqs.push_back(ucp_put_nbx(ep, src->data() + s.src_offset, s.bytes,
                                   remote_base + s.dst_offset, rkey, &put));
      }
      ucp_request_param_t flush{};
      reqs.push_back(ucp_ep_flush_nbx(ep, &flush));
      for (ucs_status_ptr_t r : reqs) {
        if (ucs_status_t st = WaitRequest(u.worker, r); st != UCS_OK && failed.ok()) {
          failed = UnavailableError(std::string("ucx baseline: put: ") + ucs_status_string(st));
        }
      }
      if (!failed.ok()) break;
      if (pass == 1) {
        seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
  }
  ucp_rkey_destroy(rkey);
  ucp_request_param_t close_params{};
  close_params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  close_params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  WaitRequest(u.worker, ucp_ep_close_nbx(ep, &close_params));
  ucp_mem_unmap(u.context, memh);
  Status verdict = child->FinishAndCompare(raw::HashSrc(src->data(), transfers.back()));
  if (!failed.ok()) return failed;
  if (!verdict.ok()) return verdict;
  return seconds;
}

}  // namespace kvrelay::bench
