// shm_transport.cc — the shm transport: every Region is a POSIX shared
// memory segment; a writer on the same host maps the remote segment and
// memcpy's its segments into it (one-sided, like an RDMA put).
//
// ShmRegion: owned by whoever called CreateRegion (the rank's runtime). It
// creates "/kvrelay-<pid>-<name>" (name sanitized to [A-Za-z0-9._-]) with
// O_EXCL, sizes and reserves it (posix_fallocate, so a full /dev/shm is an
// error now rather than a SIGBUS later), maps it MAP_SHARED and keeps the
// name linked so writers can open it; the destructor unmaps and unlinks.
// Invariant: the mapping is layout.bytes() long for the region's life.
//
// ShmTarget: owned by the writer (one per remote region). Maps the remote
// segment read-write; Write bounds-checks every segment on both sides
// before copying any byte (kOutOfRange otherwise) and then memcpy's. The
// mapping is unmapped when the Target is destroyed. Thread-safe: Write
// touches only the two mappings and atomic stats.
//
// Registration bytes, little-endian: u32 magic 'KVSH', u16 version (1),
// u16 name length, name, u64 total bytes, u64 planes, u32 num_blocks,
// u64 block_stride_bytes. Decode checks every length and field and that
// total == planes × num_blocks × stride; Open also checks the segment's
// size (fstat) equals the registered total.
//
// Stats live in a shared_ptr so Regions and Targets may outlive the
// Transport that made them.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "base/check.h"
#include "net/byte_codec.h"
#include "net/registration_codec.h"
#include "net/transport.h"

namespace kvrelay::net {
namespace {

constexpr uint32_t kShmMagic = 0x4853564B;  // "KVSH" little-endian
constexpr uint16_t kShmVersion = 1;
constexpr size_t kMaxNameBytes = 200;
constexpr const char* kNamePrefix = "/kvrelay-";

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

bool NameCharOk(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '-';
}

// A segment name we create or agree to open: the prefix, then safe chars.
bool SegmentNameOk(const std::string& name) {
  const size_t prefix = std::strlen(kNamePrefix);
  if (name.size() <= prefix || name.size() > prefix + kMaxNameBytes + 24) return false;
  if (name.compare(0, prefix, kNamePrefix) != 0) return false;
  for (size_t i = prefix; i < name.size(); ++i) {
    if (!NameCharOk(name[i])) return false;
  }
  return true;
}

using net::AppendLe;
using net::LayoutBytes;
using net::Reader;

struct ShmRegistration {
  std::string name;
  uint64_t total_bytes = 0;
  RegionLayout layout;
};

std::vector<uint8_t> EncodeRegistration(const ShmRegistration& r) {
  std::vector<uint8_t> out;
  out.reserve(4 + 2 + 2 + r.name.size() + 8 + 8 + 4 + 8);
  AppendLe(out, kShmMagic, 4);
  AppendLe(out, kShmVersion, 2);
  AppendLe(out, static_cast<uint16_t>(r.name.size()), 2);
  out.insert(out.end(), r.name.begin(), r.name.end());
  AppendLe(out, r.total_bytes, 8);
  AppendLe(out, r.layout.planes, 8);
  AppendLe(out, r.layout.num_blocks, 4);
  AppendLe(out, r.layout.block_stride_bytes, 8);
  return out;
}

Result<ShmRegistration> DecodeRegistration(std::span<const uint8_t> in) {
  Reader reader(in);
  if (reader.Get(4) != kShmMagic || !reader.ok()) {
    return InvalidArgumentError("shm registration: bad magic");
  }
  if (reader.Get(2) != kShmVersion || !reader.ok()) {
    return InvalidArgumentError("shm registration: unsupported version");
  }
  ShmRegistration r;
  const size_t name_len = reader.Get(2);
  r.name = reader.GetString(name_len);
  r.total_bytes = reader.Get(8);
  r.layout.planes = reader.Get(8);
  r.layout.num_blocks = static_cast<uint32_t>(reader.Get(4));
  r.layout.block_stride_bytes = reader.Get(8);
  if (!reader.ok() || !reader.AtEnd()) {
    return InvalidArgumentError("shm registration: truncated or trailing bytes");
  }
  if (!SegmentNameOk(r.name)) return InvalidArgumentError("shm registration: bad segment name");
  uint64_t bytes = 0;
  if (!LayoutBytes(r.layout, &bytes) || bytes != r.total_bytes) {
    return InvalidArgumentError("shm registration: inconsistent layout");
  }
  return r;
}

class ShmRegion final : public Region {
 public:
  ShmRegion(std::string name, uint8_t* base, const RegionLayout& layout)
      : name_(std::move(name)),
        base_(base),
        layout_(layout),
        registration_(EncodeRegistration({name_, layout.bytes(), layout})),
        grants_(layout.num_blocks) {}
  ~ShmRegion() override {
    munmap(base_, layout_.bytes());
    shm_unlink(name_.c_str());
  }
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  std::span<uint8_t> bytes() override { return {base_, layout_.bytes()}; }
  const RegionLayout& layout() const override { return layout_; }
  const std::vector<uint8_t>& registration() const override { return registration_; }
  GrantTable& grants() override { return grants_; }

 private:
  const std::string name_;
  uint8_t* const base_;
  const RegionLayout layout_;
  const std::vector<uint8_t> registration_;
  GrantTable grants_;
};

class ShmTarget final : public Target {
 public:
  ShmTarget(Region* local, uint8_t* remote, uint64_t remote_bytes,
            std::shared_ptr<TransportStats> stats)
      : local_(local), remote_(remote), remote_bytes_(remote_bytes), stats_(std::move(stats)) {}
  ~ShmTarget() override { munmap(remote_, remote_bytes_); }
  ShmTarget(const ShmTarget&) = delete;
  ShmTarget& operator=(const ShmTarget&) = delete;

  Status Write(TransferId, std::span<const Segment> segments) override {
    const std::span<uint8_t> local = local_->bytes();
    uint64_t total = 0;
    for (const Segment& s : segments) {
      if (s.src_offset > local.size() || s.bytes > local.size() - s.src_offset ||
          s.dst_offset > remote_bytes_ || s.bytes > remote_bytes_ - s.dst_offset) {
        stats_->writes_failed.fetch_add(1, std::memory_order_relaxed);
        return Status(StatusCode::kOutOfRange,
                      "shm write: segment [" + std::to_string(s.src_offset) + " -> " +
                          std::to_string(s.dst_offset) + ", " + std::to_string(s.bytes) +
                          " bytes) outside a region");
      }
      total += s.bytes;
    }
    for (const Segment& s : segments) {
      std::memcpy(remote_ + s.dst_offset, local.data() + s.src_offset, s.bytes);
    }
    stats_->writes_ok.fetch_add(1, std::memory_order_relaxed);
    stats_->bytes_written.fetch_add(total, std::memory_order_relaxed);
    return Status::Ok();
  }

 private:
  Region* const local_;
  uint8_t* const remote_;
  const uint64_t remote_bytes_;
  const std::shared_ptr<TransportStats> stats_;
};

class ShmTransport final : public Transport {
 public:
  ShmTransport() : stats_(std::make_shared<TransportStats>()) {}

  TransportKind kind() const override { return TransportKind::kShm; }

  Result<std::unique_ptr<Region>> CreateRegion(const std::string& name,
                                               const RegionLayout& layout) override {
    uint64_t bytes = 0;
    if (!LayoutBytes(layout, &bytes)) {
      return InvalidArgumentError("shm region: empty or oversized layout");
    }
    std::string safe = name.substr(0, kMaxNameBytes);
    for (char& c : safe) {
      if (!NameCharOk(c)) c = '_';
    }
    const std::string segment =
        std::string(kNamePrefix) + std::to_string(getpid()) + "-" + safe;
    const int fd = shm_open(segment.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST) return AlreadyExistsError("shm segment " + segment + " exists");
      return UnavailableError(Errno(("shm_open " + segment).c_str()));
    }
    auto fail = [&](const char* what) {
      Status status = UnavailableError(Errno(what) + " (" + segment + ")");
      close(fd);
      shm_unlink(segment.c_str());
      return status;
    };
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("ftruncate");
    // Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS
    // on some later write.
    if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
      errno = err;
      return fail("posix_fallocate");
    }
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return fail("mmap");
    close(fd);
    return std::unique_ptr<Region>(
        std::make_unique<ShmRegion>(segment, static_cast<uint8_t*>(base), layout));
  }

  Result<std::unique_ptr<Target>> Open(std::span<const uint8_t> registration,
                                       Region* local) override {
    KV_CHECK(local != nullptr);
    Result<ShmRegistration> r = DecodeRegistration(registration);
    if (!r.ok()) return r.status();
    const int fd = shm_open(r->name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return UnavailableError(Errno(("shm_open " + r->name).c_str()));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      Status status = UnavailableError(Errno("fstat"));
      close(fd);
      return status;
    }
    if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) != r->total_bytes) {
      close(fd);
      return InvalidArgumentError("shm segment " + r->name + " is " +
                                  std::to_string(st.st_size) + " bytes, registered " +
                                  std::to_string(r->total_bytes));
    }
    void* base = mmap(nullptr, r->total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    Status map_status = base == MAP_FAILED ? UnavailableError(Errno("mmap")) : Status::Ok();
    close(fd);
    if (!map_status.ok()) return map_status;
    return std::unique_ptr<Target>(std::make_unique<ShmTarget>(
        local, static_cast<uint8_t*>(base), r->total_bytes, stats_));
  }

  const TransportStats& stats() const override { return *stats_; }

 private:
  const std::shared_ptr<TransportStats> stats_;
};

}  // namespace

Result<std::vector<uint8_t>> ReencodeShmRegistration(std::span<const uint8_t> bytes) {
  Result<ShmRegistration> r = DecodeRegistration(bytes);
  if (!r.ok()) return r.status();
  return EncodeRegistration(*r);
}

Result<std::unique_ptr<Transport>> MakeShmTransport(const TransportOptions&) {
  return std::unique_ptr<Transport>(std::make_unique<ShmTransport>());
}

}  // namespace kvrelay::net
