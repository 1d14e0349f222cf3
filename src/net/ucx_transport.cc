// ucx_transport.cc — the UCX implementation of Transport; see
// ucx_transport.h for the model, thread model and ownership.
//
// Layout of this file: Mapping (one registered memory range), the
// registration codec, UcxRegion, UcxEndpoint (UcxTarget, UcxSource),
// UcxTransport, MakeUcxTransport. The UCX context, worker and progress
// thread they share (UcxCore) are in ucx_core.{h,cc}.

#include "net/ucx_transport.h"
#include "net/registration_codec.h"
#include "net/ucx_core.h"

#include <poll.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/byte_codec.h"
#include "base/check.h"
#include "base/mutex.h"
#include "net/byte_codec.h"

namespace kvrelay::net {
namespace {

using ucx::Clock;
using ucx::CloseEp;
using ucx::EpState;
using ucx::UcsError;
using ucx::UcsToStatus;
using ucx::UcxCore;

// How long a Write or a Read waits for its puts/gets and flush before
// giving up: 30 s, and 1 s more per 64 MiB it moves — a bound for a peer
// that stopped answering, not for a big copy on a slow host (4.4 GiB, a
// 32K-token 8b prompt, took 8 s alone here and over 30 s beside three
// more engines' pools).
constexpr auto kCopyTimeout = std::chrono::seconds(30);
std::chrono::seconds CopyTimeout(uint64_t bytes) {
  return kCopyTimeout + std::chrono::seconds(bytes >> 26);
}

// ---------------------------------------------------------------------------
// Mapping: one mmap'd, ucp_mem_map'ed range. Shared by its UcxRegion and
// the Targets writing from it; the registration is released with the last.
// The range holds the region's bytes, then (at LivenessOffset(bytes)) the
// region's liveness word: a random non-zero nonce while the UcxRegion
// lives, 0 from its destruction on (and 0 once retired: the pages read as
// zeros). A reader gets it after its data to learn the region was alive
// throughout.
struct Mapping {
  std::shared_ptr<UcxCore> core;
  uint8_t* base = nullptr;
  size_t bytes = 0;         // the region's bytes
  size_t mapped_bytes = 0;  // bytes + the liveness word's line
  ucp_mem_h memh = nullptr;

  ~Mapping() {
    if (memh != nullptr) {
      MutexLock lock(&core->mu);
      ucp_mem_unmap(core->context, memh);
    }
    if (base != nullptr) core->RetireRange(base, mapped_bytes);
  }
};

// Where a region of `bytes` keeps its liveness word (its own cache line,
// after the bytes), and how much is mapped and registered for it.
constexpr uint64_t kLivenessLine = 64;
constexpr uint64_t LivenessOffset(uint64_t bytes) {
  return (bytes + kLivenessLine - 1) / kLivenessLine * kLivenessLine;
}

std::atomic_ref<uint64_t> LivenessWord(Mapping& m) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(m.base + LivenessOffset(m.bytes)));
}

// ---------------------------------------------------------------------------
// Registration codec.

// A length-prefixed blob of at most kUcxMaxBlobBytes (never empty).
bool ReadBlob(ByteReader& rd, std::vector<uint8_t>* out) {
  const uint32_t len = rd.U32();
  return !rd.bad() && len != 0 && len <= kUcxMaxBlobBytes && len <= rd.left() &&
         rd.Take(len, out);
}

struct Registration {
  uint64_t remote_address = 0;
  uint64_t total_bytes = 0;
  RegionLayout layout;
  std::vector<uint8_t> worker_address;
  std::vector<uint8_t> rkey;
};

std::vector<uint8_t> EncodeUcxRegistration(const Registration& r) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U32(kUcxRegistrationMagic);
  w.U32(kUcxRegistrationVersion);
  w.U64(r.remote_address);
  w.U64(r.total_bytes);
  w.U64(r.layout.planes);
  w.U32(r.layout.num_blocks);
  w.U64(r.layout.block_stride_bytes);
  for (const std::vector<uint8_t>* blob : {&r.worker_address, &r.rkey}) {
    w.U32(static_cast<uint32_t>(blob->size()));
    w.Bytes(*blob);
  }
  w.U64(Fnv1a64(out));
  return out;
}

Status DecodeUcxRegistration(std::span<const uint8_t> in, Registration* r) {
  auto bad = [](const std::string& why) {
    return InvalidArgumentError("ucx registration: " + why);
  };
  // Fixed header + two length prefixes + checksum, and two capped blobs.
  constexpr size_t kMinBytes = 4 + 4 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 4 + 1 + 8;
  constexpr size_t kMaxBytes = kMinBytes - 2 + 2 * kUcxMaxBlobBytes;
  if (in.size() < kMinBytes) return bad("truncated (" + std::to_string(in.size()) + " bytes)");
  if (in.size() > kMaxBytes) return bad("oversized (" + std::to_string(in.size()) + " bytes)");
  ByteReader rd(in);
  const uint32_t magic = rd.U32();
  if (rd.bad() || magic != kUcxRegistrationMagic) return bad("bad magic");
  const uint32_t version = rd.U32();
  if (rd.bad() || version != kUcxRegistrationVersion) {
    return bad("unsupported version " + std::to_string(version));
  }
  r->remote_address = rd.U64();
  r->total_bytes = rd.U64();
  r->layout.planes = rd.U64();
  r->layout.num_blocks = rd.U32();
  r->layout.block_stride_bytes = rd.U64();
  if (rd.bad()) return bad("truncated header");
  if (!ReadBlob(rd, &r->worker_address)) return bad("bad worker address length");
  if (!ReadBlob(rd, &r->rkey)) return bad("bad rkey length");
  const size_t summed = rd.pos();
  const uint64_t sum = rd.U64();
  if (rd.bad()) return bad("truncated checksum");
  if (!rd.AtEnd()) return bad("trailing bytes");
  if (sum != Fnv1a64(in.first(summed))) return bad("checksum mismatch");

  uint64_t layout_bytes = 0;
  if (!LayoutBytes(r->layout, &layout_bytes) || layout_bytes != r->total_bytes) {
    return bad("layout does not match total bytes");
  }
  uint64_t end;
  if (r->total_bytes == 0 || r->remote_address == 0 ||
      __builtin_add_overflow(r->remote_address, r->total_bytes, &end)) {
    return bad("bad remote range");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// UcxRegion: a registered region. Thread-safe (immutable after creation,
// except the GrantTable, which is itself thread-safe).
class UcxRegion final : public Region {
 public:
  UcxRegion(std::shared_ptr<Mapping> mapping, const RegionLayout& layout,
            std::vector<uint8_t> registration)
      : mapping_(std::move(mapping)),
        layout_(layout),
        registration_(std::move(registration)),
        grants_(layout.num_blocks),
        read_grants_(layout.num_blocks) {
    std::random_device random;
    uint64_t nonce = 0;
    while (nonce == 0) nonce = (uint64_t{random()} << 32) ^ random();
    LivenessWord(*mapping_).store(nonce, std::memory_order_release);
  }
  // Readers' Reads fail from now on, even while local Targets keep the
  // mapping (and so the bytes) alive.
  ~UcxRegion() override { LivenessWord(*mapping_).store(0, std::memory_order_release); }
  UcxRegion(const UcxRegion&) = delete;
  UcxRegion& operator=(const UcxRegion&) = delete;

  std::span<uint8_t> bytes() override { return {mapping_->base, mapping_->bytes}; }
  const RegionLayout& layout() const override { return layout_; }
  const std::vector<uint8_t>& registration() const override { return registration_; }
  GrantTable& grants() override { return grants_; }
  ReadGrantTable& read_grants() override { return read_grants_; }

  const std::shared_ptr<Mapping>& mapping() const { return mapping_; }

 private:
  std::shared_ptr<Mapping> mapping_;
  RegionLayout layout_;
  std::vector<uint8_t> registration_;
  GrantTable grants_;
  ReadGrantTable read_grants_;
};

// ---------------------------------------------------------------------------
// UcxEndpoint: an endpoint to a remote region's worker plus its rkey, and
// the one-sided copies over it (UcxTarget puts, UcxSource gets).
// Thread-safe: Copy and ReadLiveness may be called from several threads at
// once (UCX calls under core->mu; each call waits for its own requests).
class UcxEndpoint {
 public:
  UcxEndpoint(std::shared_ptr<UcxCore> core, std::shared_ptr<Mapping> local,
              const Registration& reg)
      : core_(std::move(core)),
        local_(std::move(local)),
        remote_address_(reg.remote_address),
        remote_bytes_(reg.total_bytes) {}

  ~UcxEndpoint() {
    if (rkey_ != nullptr) {
      MutexLock lock(&core_->mu);
      ucp_rkey_destroy(rkey_);
    }
    if (ep_ != nullptr && !CloseEp(*core_, ep_)) core_->AdoptOrphan(std::move(ep_state_));
  }
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;

  // Creates the endpoint and unpacks the rkey. Called once, by Open or
  // OpenSource.
  Status Connect(const Registration& reg) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(reg.worker_address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxEndpoint::OnEpError;
    params.err_handler.arg = ep_state_.get();
    MutexLock lock(&core_->mu);
    ucs_status_t st = ucp_ep_create(core_->worker, &params, &ep_);
    if (st != UCS_OK) {
      ep_ = nullptr;
      return UnavailableError(UcsError("ucx: ucp_ep_create", st));
    }
    st = ucp_ep_rkey_unpack(ep_, reg.rkey.data(), &rkey_);
    if (st != UCS_OK) {
      rkey_ = nullptr;  // the destructor closes ep_
      return UnavailableError(UcsError("ucx: ucp_ep_rkey_unpack", st));
    }
    return Status::Ok();
  }

  std::string Describe() {
    char* buf = nullptr;
    size_t len = 0;
    FILE* f = open_memstream(&buf, &len);
    if (f == nullptr) return {};
    {
      MutexLock lock(&core_->mu);
      ucp_ep_print_info(ep_, f);
    }
    fclose(f);
    std::string out(buf, len);
    free(buf);
    return out;
  }

 protected:
  enum class Dir { kPut, kGet };

  // kPut copies every segment from the local region (src) to the remote
  // one (dst); kGet from the remote region (src) to the local one (dst).
  // Issues one put/get per segment and a flush, and waits for them all
  // until kCopyTimeout or `deadline` (steady clock), whichever is first:
  // kDeadlineExceeded then (a deadline already past: before issuing
  // anything). Sets *total to the bytes. `what` names the operation in
  // messages.
  Status Copy(Dir dir, std::span<const Segment> segments, const char* what, uint64_t* total,
              Instant deadline = Instant::Never()) {
    const bool put = dir == Dir::kPut;
    const uint64_t src_limit = put ? local_->bytes : remote_bytes_;
    const uint64_t dst_limit = put ? remote_bytes_ : local_->bytes;
    for (const Segment& seg : segments) {
      if (seg.src_offset > src_limit || seg.bytes > src_limit - seg.src_offset ||
          seg.dst_offset > dst_limit || seg.bytes > dst_limit - seg.dst_offset) {
        return Status(StatusCode::kOutOfRange,
                      std::string("ucx ") + what + ": segment src " +
                          std::to_string(seg.src_offset) + " dst " +
                          std::to_string(seg.dst_offset) + " bytes " +
                          std::to_string(seg.bytes) + " outside src " +
                          std::to_string(src_limit) + " / dst " + std::to_string(dst_limit) +
                          " bytes");
      }
      *total += seg.bytes;
    }
    if (ucs_status_t e = ep_state_->error.load(std::memory_order_acquire); e != UCS_OK) {
      return UcsToStatus(std::string("ucx ") + what + ": endpoint failed earlier", e);
    }
    if (*total == 0) return Status::Ok();
    const Clock::time_point now = Clock::now();
    const Clock::time_point by_deadline{std::chrono::nanoseconds(deadline.ns())};
    if (by_deadline <= now) {
      return DeadlineExceededError(std::string("ucx ") + what +
                                   ": the deadline passed before it started");
    }
    const std::chrono::seconds timeout = CopyTimeout(*total);
    const bool deadline_first = by_deadline < now + timeout;
    const Clock::time_point wait_until = deadline_first ? by_deadline : now + timeout;
    KV_CHECK(ep_ != nullptr && rkey_ != nullptr);  // Open returns only connected endpoints

    std::vector<void*> requests;
    requests.reserve(segments.size() + 1);
    ucs_status_t issue_error = UCS_OK;
    {
      MutexLock lock(&core_->mu);
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      param.memh = local_->memh;
      for (const Segment& seg : segments) {
        if (seg.bytes == 0) continue;
        ucs_status_ptr_t r =
            put ? ucp_put_nbx(ep_, local_->base + seg.src_offset, seg.bytes,
                              remote_address_ + seg.dst_offset, rkey_, &param)
                : ucp_get_nbx(ep_, local_->base + seg.dst_offset, seg.bytes,
                              remote_address_ + seg.src_offset, rkey_, &param);
        if (UCS_PTR_IS_ERR(r)) {
          issue_error = UCS_PTR_STATUS(r);
          break;
        }
        if (r != nullptr) requests.push_back(r);
      }
      if (issue_error == UCS_OK) {
        ucp_request_param_t flush{};
        ucs_status_ptr_t r = ucp_ep_flush_nbx(ep_, &flush);
        if (UCS_PTR_IS_ERR(r)) {
          issue_error = UCS_PTR_STATUS(r);
        } else if (r != nullptr) {
          requests.push_back(r);
        }
      }
    }
    if (issue_error != UCS_OK) {
      // The operations issued so far finish (or fail) on their own; the
      // local memory stays registered while this endpoint holds local_.
      core_->FreeRequests(requests);
      return UcsToStatus(std::string("ucx ") + what + (put ? ": put/flush" : ": get/flush"),
                         issue_error);
    }
    ucs_status_t st = UCS_OK;
    bool done = core_->WaitRequests(requests, wait_until, &st);
    core_->FreeRequests(requests);
    if (!done) {
      return DeadlineExceededError(std::string("ucx ") + what + ": not complete " +
                                   (deadline_first ? std::string("by the deadline")
                                                   : "after " +
                                                         std::to_string(timeout.count()) +
                                                         " s"));
    }
    if (st != UCS_OK) return UcsToStatus(std::string("ucx ") + what, st);
    return Status::Ok();
  }

  // Gets the remote region's liveness word into *word. Call it after the
  // data's gets completed: it is then read after them.
  Status ReadLiveness(uint64_t* word) {
    if (ucs_status_t e = ep_state_->error.load(std::memory_order_acquire); e != UCS_OK) {
      return UcsToStatus("ucx read: endpoint failed earlier", e);
    }
    // On the heap: if the get does not complete in time it may still land
    // later, so the buffer is then left to it (8 bytes, on a failure path).
    auto buffer = std::make_unique<uint64_t>(0);
    ucs_status_ptr_t r;
    {
      MutexLock lock(&core_->mu);
      ucp_request_param_t param{};
      r = ucp_get_nbx(ep_, buffer.get(), sizeof(uint64_t),
                      remote_address_ + LivenessOffset(remote_bytes_), rkey_, &param);
    }
    if (UCS_PTR_IS_ERR(r)) return UcsToStatus("ucx read: liveness get", UCS_PTR_STATUS(r));
    if (r != nullptr) {
      const std::vector<void*> requests{r};
      ucs_status_t st = UCS_OK;
      const bool done = core_->WaitRequests(requests, Clock::now() + kCopyTimeout, &st);
      core_->FreeRequests(requests);
      if (!done) {
        (void)buffer.release();
        return DeadlineExceededError("ucx read: liveness get not complete after " +
                                     std::to_string(kCopyTimeout.count()) + " s");
      }
      if (st != UCS_OK) return UcsToStatus("ucx read: liveness get", st);
    }
    *word = *buffer;
    return Status::Ok();
  }

  TransportStats& stats() { return core_->stats; }

  // Counts an operation's outcome in `ok` or `failed` and, if it
  // succeeded, its `total` bytes in `bytes`; returns `s`.
  static Status Counted(Status s, uint64_t total, std::atomic<uint64_t>& ok,
                        std::atomic<uint64_t>& failed, std::atomic<uint64_t>& bytes) {
    if (s.ok()) {
      ok.fetch_add(1, std::memory_order_relaxed);
      bytes.fetch_add(total, std::memory_order_relaxed);
    } else {
      failed.fetch_add(1, std::memory_order_relaxed);
    }
    return s;
  }

 private:
  static void OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    // Runs inside ucp_worker_progress, under core->mu.
    static_cast<EpState*>(arg)->error.store(status, std::memory_order_release);
  }

  std::shared_ptr<UcxCore> core_;
  std::shared_ptr<Mapping> local_;
  const uint64_t remote_address_;
  const uint64_t remote_bytes_;
  ucp_ep_h ep_ = nullptr;      // set once by Connect
  ucp_rkey_h rkey_ = nullptr;  // set once by Connect
  std::unique_ptr<EpState> ep_state_ = std::make_unique<EpState>();
};

// UcxTarget: Write = put + flush over its endpoint.
class UcxTarget final : public Target, public UcxEndpoint {
 public:
  using UcxEndpoint::UcxEndpoint;

  using Target::Write;
  Status Write(TransferId /*transfer*/, std::span<const Segment> segments,
               Instant deadline) override {
    uint64_t total = 0;
    Status s = Copy(Dir::kPut, segments, "write", &total, deadline);
    return Counted(std::move(s), total, stats().writes_ok, stats().writes_failed,
                   stats().bytes_written);
  }
};

// UcxSource: Read = gets + flush, then the remote region's liveness word,
// which must still be the nonce OpenSource saw (the region was alive until
// after the data was read).
class UcxSource final : public Source, public UcxEndpoint {
 public:
  using UcxEndpoint::UcxEndpoint;

  // Learns the remote region's nonce. Called once, by OpenSource, after
  // Connect.
  Status Attach() {
    if (Status s = ReadLiveness(&nonce_); !s.ok()) return s;
    if (nonce_ == 0) return UnavailableError("ucx: the remote region is gone");
    return Status::Ok();
  }

  Status Read(TransferId /*transfer*/, std::span<const Segment> segments) override {
    uint64_t total = 0;
    Status s = Copy(Dir::kGet, segments, "read", &total);
    if (s.ok() && total > 0) {
      uint64_t word = 0;
      s = ReadLiveness(&word);
      if (s.ok() && word != nonce_) {
        s = UnavailableError("ucx read: the remote region is gone");
      }
    }
    return Counted(std::move(s), total, stats().reads_ok, stats().reads_failed,
                   stats().bytes_read);
  }

 private:
  uint64_t nonce_ = 0;  // set once by Attach
};

// ---------------------------------------------------------------------------
// UcxTransport: owns a reference to the core. Thread-safe.
class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(std::shared_ptr<UcxCore> core) : core_(std::move(core)) {}

  TransportKind kind() const override { return TransportKind::kUcx; }
  const TransportStats& stats() const override { return core_->stats; }

  Result<std::unique_ptr<Region>> CreateRegion(const std::string& name,
                                               const RegionLayout& layout) override {
    uint64_t bytes = 0;
    if (!LayoutBytes(layout, &bytes) || bytes == 0 || bytes > SIZE_MAX / 2) {
      return InvalidArgumentError("ucx region " + name + ": bad layout (" +
                                  std::to_string(layout.planes) + " planes x " +
                                  std::to_string(layout.num_blocks) + " blocks x " +
                                  std::to_string(layout.block_stride_bytes) + " bytes)");
    }
    const uint64_t mapped = LivenessOffset(bytes) + kLivenessLine;
    void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      return ResourceExhaustedError("ucx region " + name + ": mmap of " + std::to_string(bytes) +
                                    " bytes: " + std::strerror(errno));
    }
    auto mapping = std::make_shared<Mapping>();
    mapping->core = core_;
    mapping->base = static_cast<uint8_t*>(base);
    mapping->bytes = bytes;
    mapping->mapped_bytes = mapped;

    std::vector<uint8_t> rkey;
    std::string failed;  // which UCX call failed, if one did
    ucs_status_t st = UCS_OK;
    {
      MutexLock lock(&core_->mu);
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_PROT;
      mp.address = base;
      mp.length = mapped;  // the liveness word too: readers get it
      // Peers put (push mode) and get (read mode); UCX's default, said.
      mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
                UCP_MEM_MAP_PROT_REMOTE_READ | UCP_MEM_MAP_PROT_REMOTE_WRITE;
      st = ucp_mem_map(core_->context, &mp, &mapping->memh);
      if (st != UCS_OK) {
        mapping->memh = nullptr;
        failed = "ucp_mem_map";
      } else {
        void* rkey_buf = nullptr;
        size_t rkey_len = 0;
        st = ucp_rkey_pack(core_->context, mapping->memh, &rkey_buf, &rkey_len);
        if (st != UCS_OK) {
          failed = "ucp_rkey_pack";
        } else {
          const auto* p = static_cast<const uint8_t*>(rkey_buf);
          rkey.assign(p, p + rkey_len);
          ucp_rkey_buffer_release(rkey_buf);
        }
      }
    }
    // On failure `mapping` releases the registration and the range.
    if (!failed.empty()) return UnavailableError(UcsError("ucx region " + name + ": " + failed, st));
    if (rkey.empty() || rkey.size() > kUcxMaxBlobBytes) {
      return UnavailableError("ucx region " + name + ": rkey of " + std::to_string(rkey.size()) +
                              " bytes (limit " + std::to_string(kUcxMaxBlobBytes) + ")");
    }
    Registration reg;
    reg.remote_address = reinterpret_cast<uintptr_t>(base);
    reg.total_bytes = bytes;
    reg.layout = layout;
    reg.worker_address = core_->worker_address;
    reg.rkey = std::move(rkey);
    return std::unique_ptr<Region>(
        std::make_unique<UcxRegion>(std::move(mapping), layout, EncodeUcxRegistration(reg)));
  }

  Result<std::unique_ptr<Target>> Open(std::span<const uint8_t> registration,
                                       Region* local) override {
    Result<std::unique_ptr<UcxTarget>> target = Connected<UcxTarget>(registration, local);
    if (!target.ok()) return target.status();
    return std::unique_ptr<Target>(std::move(target).value());
  }

  Result<std::unique_ptr<Source>> OpenSource(std::span<const uint8_t> registration,
                                             Region* local) override {
    Result<std::unique_ptr<UcxSource>> source = Connected<UcxSource>(registration, local);
    if (!source.ok()) return source.status();
    if (Status s = source.value()->Attach(); !s.ok()) return s;
    return std::unique_ptr<Source>(std::move(source).value());
  }

 private:
  // A UcxTarget or UcxSource from `local` (a region of this transport) to
  // the registered remote region, its endpoint connected.
  template <typename Endpoint>
  Result<std::unique_ptr<Endpoint>> Connected(std::span<const uint8_t> registration,
                                              Region* local) {
    auto* region = dynamic_cast<UcxRegion*>(local);
    if (region == nullptr) return InvalidArgumentError("ucx open: local region is not a UCX region");
    if (region->mapping()->core != core_) {
      return InvalidArgumentError("ucx open: local region belongs to another UCX transport");
    }
    Registration reg;
    if (Status s = DecodeUcxRegistration(registration, &reg); !s.ok()) return s;
    auto endpoint = std::make_unique<Endpoint>(core_, region->mapping(), reg);
    if (Status s = endpoint->Connect(reg); !s.ok()) return s;
    return endpoint;
  }

  std::shared_ptr<UcxCore> core_;
};

}  // namespace

Result<std::vector<uint8_t>> ReencodeUcxRegistration(std::span<const uint8_t> bytes) {
  Registration reg;
  if (Status s = DecodeUcxRegistration(bytes, &reg); !s.ok()) return s;
  return EncodeUcxRegistration(reg);
}

std::string DescribeUcxTarget(Target& target) {
  auto* t = dynamic_cast<UcxTarget*>(&target);
  return t == nullptr ? std::string() : t->Describe();
}

Result<std::unique_ptr<Transport>> MakeUcxTransport(const TransportOptions& options) {
  Result<std::shared_ptr<UcxCore>> core = UcxCore::Create(options);
  if (!core.ok()) return core.status();
  return std::unique_ptr<Transport>(std::make_unique<UcxTransport>(std::move(core).value()));
}

}  // namespace kvrelay::net
