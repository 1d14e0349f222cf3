// shm_transport.cc — the shm transport: every Region is a POSIX shared
// memory segment; a writer on the same host maps the remote segment and
// memcpy's its segments into it (one-sided, like an RDMA put).
//
// ShmRegion: owned by whoever called CreateRegion (the rank's runtime). It
// creates "/kvrelay-<pid>-<name>" (name sanitized to [A-Za-z0-9._-]) with
// O_EXCL, sizes and reserves it (posix_fallocate, so a full /dev/shm is an
// error now rather than a SIGBUS later), maps it MAP_SHARED and keeps the
// name linked so writers can open it; the destructor unmaps and unlinks.
// It also keeps the segment's fd open with an exclusive flock() on it for
// its whole life: the owner's liveness lock. The kernel drops it when the
// region is destroyed or its process dies (or when the last fork-inherited
// copy of the fd is closed: a child forked without exec keeps it held).
// Invariant: the mapping is layout.bytes() long for the region's life.
//
// ShmTarget: owned by the writer (one per remote region). Maps the remote
// segment read-write; Write bounds-checks every segment on both sides
// before copying any byte (kOutOfRange otherwise) and then memcpy's. The
// mapping is unmapped when the Target is destroyed. Thread-safe: Write
// touches only the two mappings and atomic stats.
//
// ShmSource: owned by the reader (read mode; one per remote region). Maps
// the remote segment read-only and keeps its fd; Read bounds-checks every
// segment, memcpy's remote → local, and returns OK only if the owner's
// liveness lock is still held after the copy (a shared flock attempt on its
// own fd fails with EWOULDBLOCK); it checks before the copy too, to fail
// fast. A Read of a destroyed region, or one whose process died, fails
// kUnavailable. Thread-safe like ShmTarget.
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
#include <sys/file.h>
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
#include "os/clock.h"
#include "os/errno_message.h"

namespace kvrelay::net {
namespace {

constexpr uint32_t kShmMagic = 0x4853564B;  // "KVSH" little-endian
constexpr uint16_t kShmVersion = 1;
constexpr size_t kMaxNameBytes = 200;
constexpr const char* kNamePrefix = "/kvrelay-";


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

std::vector<uint8_t> EncodeShmRegistration(const ShmRegistration& r) {
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

Result<ShmRegistration> DecodeShmRegistration(std::span<const uint8_t> in) {
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
  // Takes `fd` (the segment, its liveness lock held).
  ShmRegion(std::string name, int fd, uint8_t* base, const RegionLayout& layout)
      : name_(std::move(name)),
        fd_(fd),
        base_(base),
        layout_(layout),
        registration_(EncodeShmRegistration({name_, layout.bytes(), layout})),
        grants_(layout.num_blocks),
        read_grants_(layout.num_blocks) {}
  ~ShmRegion() override {
    munmap(base_, layout_.bytes());
    shm_unlink(name_.c_str());
    close(fd_);  // drops the liveness lock: readers' Reads fail from now on
  }
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  std::span<uint8_t> bytes() override { return {base_, layout_.bytes()}; }
  const RegionLayout& layout() const override { return layout_; }
  const std::vector<uint8_t>& registration() const override { return registration_; }
  GrantTable& grants() override { return grants_; }
  ReadGrantTable& read_grants() override { return read_grants_; }

 private:
  const std::string name_;
  const int fd_;
  uint8_t* const base_;
  const RegionLayout layout_;
  const std::vector<uint8_t> registration_;
  GrantTable grants_;
  ReadGrantTable read_grants_;
};

class ShmTarget final : public Target {
 public:
  ShmTarget(Region* local, uint8_t* remote, uint64_t remote_bytes,
            std::shared_ptr<TransportStats> stats)
      : local_(local), remote_(remote), remote_bytes_(remote_bytes), stats_(std::move(stats)) {}
  ~ShmTarget() override { munmap(remote_, remote_bytes_); }
  ShmTarget(const ShmTarget&) = delete;
  ShmTarget& operator=(const ShmTarget&) = delete;

  using Target::Write;
  // A memcpy waits on nothing: the deadline is only checked before it.
  Status Write(TransferId, std::span<const Segment> segments, Instant deadline) override {
    if (MonoNow() >= deadline) {
      stats_->writes_failed.fetch_add(1, std::memory_order_relaxed);
      return DeadlineExceededError("shm write: the deadline passed before it started");
    }
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
  bool CopiesInPlace() const override { return true; }

 private:
  Region* const local_;
  uint8_t* const remote_;
  const uint64_t remote_bytes_;
  const std::shared_ptr<TransportStats> stats_;
};

// True while the owner of the segment behind `fd` holds its liveness lock.
bool OwnerAlive(int fd) {
  while (true) {
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
      flock(fd, LOCK_UN);  // we got it: nobody holds the owner's lock
      return false;
    }
    if (errno != EINTR) return errno == EWOULDBLOCK;
  }
}

class ShmSource final : public Source {
 public:
  // Takes `fd` and the read-only mapping `remote`.
  ShmSource(Region* local, int fd, const uint8_t* remote, uint64_t remote_bytes,
            std::shared_ptr<TransportStats> stats)
      : local_(local), fd_(fd), remote_(remote), remote_bytes_(remote_bytes),
        stats_(std::move(stats)) {}
  ~ShmSource() override {
    munmap(const_cast<uint8_t*>(remote_), remote_bytes_);
    close(fd_);
  }
  ShmSource(const ShmSource&) = delete;
  ShmSource& operator=(const ShmSource&) = delete;

  bool CopiesInPlace() const override { return true; }
  Status Read(TransferId, std::span<const Segment> segments) override {
    Status status = Copy(segments);
    if (status.ok()) {
      stats_->reads_ok.fetch_add(1, std::memory_order_relaxed);
    } else {
      stats_->reads_failed.fetch_add(1, std::memory_order_relaxed);
    }
    return status;
  }

 private:
  Status Copy(std::span<const Segment> segments) {
    const std::span<uint8_t> local = local_->bytes();
    uint64_t total = 0;
    for (const Segment& s : segments) {
      if (s.src_offset > remote_bytes_ || s.bytes > remote_bytes_ - s.src_offset ||
          s.dst_offset > local.size() || s.bytes > local.size() - s.dst_offset) {
        return Status(StatusCode::kOutOfRange,
                      "shm read: segment [" + std::to_string(s.src_offset) + " -> " +
                          std::to_string(s.dst_offset) + ", " + std::to_string(s.bytes) +
                          " bytes) outside a region");
      }
      total += s.bytes;
    }
    if (!OwnerAlive(fd_)) return UnavailableError("shm read: the remote region is gone");
    for (const Segment& s : segments) {
      std::memcpy(local.data() + s.dst_offset, remote_ + s.src_offset, s.bytes);
    }
    // Destroyed (or its owner died) during the copy: the bytes may be of
    // blocks already handed to something else.
    if (!OwnerAlive(fd_)) {
      return UnavailableError("shm read: the remote region went away during the read");
    }
    stats_->bytes_read.fetch_add(total, std::memory_order_relaxed);
    return Status::Ok();
  }

  Region* const local_;
  const int fd_;
  const uint8_t* const remote_;
  const uint64_t remote_bytes_;
  const std::shared_ptr<TransportStats> stats_;
};

// A remote segment opened and mapped from its registration.
struct RemoteSegment {
  int fd = -1;
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
};

// Opens and maps the segment a registration names, read-write (a Target)
// or read-only (a Source), after checking its size.
Result<RemoteSegment> MapRemote(std::span<const uint8_t> registration, bool writable) {
  Result<ShmRegistration> r = DecodeShmRegistration(registration);
  if (!r.ok()) return r.status();
  const int fd = shm_open(r->name.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
  if (fd < 0) return UnavailableError(ErrnoMessage("shm_open " + r->name));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status status = UnavailableError(ErrnoMessage("fstat"));
    close(fd);
    return status;
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) != r->total_bytes) {
    close(fd);
    return InvalidArgumentError("shm segment " + r->name + " is " +
                                std::to_string(st.st_size) + " bytes, registered " +
                                std::to_string(r->total_bytes));
  }
  void* base = mmap(nullptr, r->total_bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    Status status = UnavailableError(ErrnoMessage("mmap"));
    close(fd);
    return status;
  }
  return RemoteSegment{fd, static_cast<uint8_t*>(base), r->total_bytes};
}

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
      return UnavailableError(ErrnoMessage("shm_open " + segment));
    }
    auto fail = [&](const char* what) {
      Status status = UnavailableError(ErrnoMessage(what) + " (" + segment + ")");
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
    // The liveness lock, before the registration exists: no reader can
    // see the region without it.
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) return fail("flock");
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return fail("mmap");
    return std::unique_ptr<Region>(
        std::make_unique<ShmRegion>(segment, fd, static_cast<uint8_t*>(base), layout));
  }

  Result<std::unique_ptr<Target>> Open(std::span<const uint8_t> registration,
                                       Region* local) override {
    KV_CHECK(local != nullptr);
    Result<RemoteSegment> remote = MapRemote(registration, /*writable=*/true);
    if (!remote.ok()) return remote.status();
    close(remote->fd);
    return std::unique_ptr<Target>(
        std::make_unique<ShmTarget>(local, remote->base, remote->bytes, stats_));
  }

  Result<std::unique_ptr<Source>> OpenSource(std::span<const uint8_t> registration,
                                             Region* local) override {
    KV_CHECK(local != nullptr);
    Result<RemoteSegment> remote = MapRemote(registration, /*writable=*/false);
    if (!remote.ok()) return remote.status();
    auto source =
        std::make_unique<ShmSource>(local, remote->fd, remote->base, remote->bytes, stats_);
    // A segment still linked but whose owner died (a crashed process).
    if (!OwnerAlive(remote->fd)) return UnavailableError("shm: the remote region's owner is gone");
    return std::unique_ptr<Source>(std::move(source));
  }

  const TransportStats& stats() const override { return *stats_; }

 private:
  const std::shared_ptr<TransportStats> stats_;
};

}  // namespace

Result<std::vector<uint8_t>> ReencodeShmRegistration(std::span<const uint8_t> bytes) {
  Result<ShmRegistration> r = DecodeShmRegistration(bytes);
  if (!r.ok()) return r.status();
  return EncodeShmRegistration(*r);
}

Result<std::unique_ptr<Transport>> MakeShmTransport(const TransportOptions&) {
  return std::unique_ptr<Transport>(std::make_unique<ShmTransport>());
}

}  // namespace kvrelay::net
