#include "runtime/local_lane.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "base/check.h"
#include "net/byte_codec.h"
#include "os/errno_message.h"

namespace kvrelay::runtime {

namespace {

constexpr char kAttachMagic[] = "KVLANE1:";
constexpr size_t kAttachMagicLen = sizeof kAttachMagic - 1;
constexpr size_t kMaxRoutingId = 255;
constexpr size_t kReadChunk = 256 * 1024;  // the buffer's first size, and each growth's least
constexpr size_t kMinRoom = 64 * 1024;     // a recv gets at least this much room

// The abstract-namespace address for `name` (no file on disk; it goes away
// with the socket).
socklen_t AbstractAddress(const std::string& name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  KV_CHECK(name.size() + 1 <= sizeof addr->sun_path);
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}


}  // namespace

std::string LaneAddress(uint32_t engine, uint32_t rank, uint32_t port) {
  return "kvrelay/lane/e" + std::to_string(engine) + "/r" + std::to_string(rank) + "/p" +
         std::to_string(port);
}

std::vector<uint8_t> LaneAttachFrame(const std::string& routing_id) {
  std::vector<uint8_t> f(kAttachMagicLen + routing_id.size());
  std::memcpy(f.data(), kAttachMagic, kAttachMagicLen);
  if (!routing_id.empty()) {
    std::memcpy(f.data() + kAttachMagicLen, routing_id.data(), routing_id.size());
  }
  return f;
}

std::optional<std::string> ParseLaneAttach(const uint8_t* data, size_t size) {
  if (size <= kAttachMagicLen || size > kAttachMagicLen + kMaxRoutingId ||
      std::memcmp(data, kAttachMagic, kAttachMagicLen) != 0) {
    return std::nullopt;
  }
  return std::string(reinterpret_cast<const char*>(data) + kAttachMagicLen,
                     size - kAttachMagicLen);
}

// --- LocalLane ---------------------------------------------------------------

Result<std::unique_ptr<LocalLane>> LocalLane::Connect(const std::string& address,
                                                      const LaneLimits& limits) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(StatusCode::kUnavailable, ErrnoMessage("socket"));
  sockaddr_un addr;
  const socklen_t len = AbstractAddress(address, &addr);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    const std::string why = ErrnoMessage("connect");
    close(fd);
    return Status(StatusCode::kUnavailable, why);
  }
  return std::make_unique<LocalLane>(fd, limits);
}

LocalLane::LocalLane(int fd, const LaneLimits& limits) : fd_(fd), limits_(limits) {
  KV_CHECK(fd_ >= 0);
  const int flags = fcntl(fd_, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) == 0) fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == sizeof cred) {
    peer_pid_ = cred.pid;
  }
}

bool ProcessGone(int pid) {
  if (pid <= 0) return false;
  // /proc/<pid>/stat: "pid (comm) S ...": gone if absent, a zombie (Z) or
  // dead (X).
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  char buf[512];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // comm may hold spaces or ')'
  if (paren == nullptr || paren[1] != ' ') return false;
  return paren[2] == 'Z' || paren[2] == 'X';
}

LocalLane::~LocalLane() {
  if (fd_ >= 0) close(fd_);
}

void LocalLane::Break(std::string why) {
  if (broken_) return;
  broken_ = true;
  why_ = std::move(why);
  out_.clear();
  out_bytes_ = 0;
  out_offset_ = 0;
  // in_ stays as it is: Break may run inside Read's on_frame, which was
  // handed a pointer into it.
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

LocalLane::SendResult LocalLane::Send(const std::vector<uint8_t>& frame) {
  if (broken_) return SendResult::kBroken;
  if (out_.size() >= limits_.max_frames || out_bytes_ + frame.size() + 4 > limits_.max_bytes) {
    return SendResult::kQueueFull;
  }
  KV_CHECK(frame.size() <= UINT32_MAX);
  std::vector<uint8_t> f(frame.size() + 4);
  net::PutLe(f.data(), frame.size(), 4);
  std::memcpy(f.data() + 4, frame.data(), frame.size());
  out_bytes_ += f.size();
  out_.push_back(std::move(f));
  Flush();
  return broken_ ? SendResult::kBroken : SendResult::kSent;
}

void LocalLane::Flush() {
  while (!broken_ && !out_.empty()) {
    const std::vector<uint8_t>& f = out_.front();
    const ssize_t w =
        send(fd_, f.data() + out_offset_, f.size() - out_offset_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Break(ErrnoMessage("send"));
      return;
    }
    out_offset_ += static_cast<size_t>(w);
    if (out_offset_ == f.size()) {
      out_bytes_ -= f.size();
      out_.pop_front();
      out_offset_ = 0;
    }
  }
}

namespace {

uint32_t FrameLength(const uint8_t* p) { return static_cast<uint32_t>(net::GetLe(p, 4)); }

}  // namespace

bool LocalLane::has_buffered_frame() const {
  if (broken_ || in_end_ - in_start_ < 4) return false;
  const uint32_t n = FrameLength(in_.data() + in_start_);
  return n > limits_.max_frame_bytes || in_end_ - in_start_ - 4 >= n;
}

void LocalLane::MakeRoomToRead() {
  if (in_.size() - in_end_ >= kMinRoom) return;
  if (in_start_ > 0) {  // never inside a callback: Read calls this first
    std::memmove(in_.data(), in_.data() + in_start_, in_end_ - in_start_);
    in_end_ -= in_start_;
    in_start_ = 0;
  }
  if (in_.size() - in_end_ < kMinRoom) {
    in_.resize(std::max(2 * in_.size(), in_end_ + kReadChunk));  // zero-fills: only to grow
  }
}

size_t LocalLane::Read(const std::function<void(const uint8_t*, size_t)>& on_frame,
                       size_t max_frames) {
  size_t delivered = 0;
  bool eof = false;
  // Read what is there (bounded, so one busy peer cannot hold the loop).
  for (size_t total = 0; !broken_ && total < 16 * kReadChunk;) {
    MakeRoomToRead();
    const ssize_t r = recv(fd_, in_.data() + in_end_, in_.size() - in_end_, MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      Break(ErrnoMessage("recv"));
      return delivered;
    }
    if (r == 0) {
      eof = true;
      break;
    }
    in_end_ += static_cast<size_t>(r);
    total += static_cast<size_t>(r);
  }
  // At EOF every whole frame is delivered now: nothing will wake us later.
  const size_t limit = eof ? SIZE_MAX : max_frames;
  while (!broken_ && delivered < limit && in_end_ - in_start_ >= 4) {
    const uint8_t* p = in_.data() + in_start_;
    const uint32_t n = FrameLength(p);
    if (n > limits_.max_frame_bytes) {
      Break("a frame of " + std::to_string(n) + " bytes is over the limit (max_frame_bytes " +
            std::to_string(limits_.max_frame_bytes) + ")");
      return delivered;
    }
    if (in_end_ - in_start_ - 4 < n) break;
    in_start_ += 4 + n;
    ++delivered;
    on_frame(p + 4, n);  // may Send on this lane or Break it; never destroys it
  }
  if (broken_) return delivered;
  if (in_start_ == in_end_) {
    in_start_ = in_end_ = 0;
    // A large frame grew the buffer: give the memory back once it is empty.
    if (in_.size() > 4 * kReadChunk) std::vector<uint8_t>().swap(in_);
  }
  if (eof) {
    peer_closed_ = true;
    Break("closed by the peer");
  }
  return delivered;
}

// --- LaneListener ------------------------------------------------------------

Result<std::unique_ptr<LaneListener>> LaneListener::Bind(const std::string& address) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(StatusCode::kUnavailable, ErrnoMessage("socket"));
  sockaddr_un addr;
  const socklen_t len = AbstractAddress(address, &addr);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    const std::string why = ErrnoMessage("bind");
    close(fd);
    return Status(StatusCode::kUnavailable, why);
  }
  return std::unique_ptr<LaneListener>(new LaneListener(fd));
}

LaneListener::~LaneListener() {
  if (fd_ >= 0) close(fd_);
}

int LaneListener::Accept() {
  for (;;) {
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0 || errno != EINTR) return fd;
  }
}

}  // namespace kvrelay::runtime
