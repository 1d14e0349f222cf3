// tcp_region.h — TcpRegion: a rank's KV memory on the tcp transport, and
// the receiver that writes arriving frames into it after checking every
// block against the region's GrantTable, and serves read requests from it
// after checking every block against its ReadGrantTable (see
// tcp_transport.cc for the theory of operation).
//
// Ownership: owned by whoever called CreateRegion; its accept thread and
// one thread per connection are stopped and joined by the destructor.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "net/tcp_stream.h"

namespace kvrelay::net::tcp {

class TcpRegion final : public Region {
 public:
  TcpRegion(uint8_t* base, const RegionLayout& layout, std::shared_ptr<TransportStats> stats);

  ~TcpRegion() override;
  TcpRegion(const TcpRegion&) = delete;
  TcpRegion& operator=(const TcpRegion&) = delete;

  // Binds the listener and starts the accept thread.
  Status Start(const std::string& host);

  std::span<uint8_t> bytes() override { return {base_, layout_.bytes()}; }
  const RegionLayout& layout() const override { return layout_; }
  const std::vector<uint8_t>& registration() const override { return registration_; }
  GrantTable& grants() override { return grants_; }
  ReadGrantTable& read_grants() override { return read_grants_; }

 private:
  struct Conn {
    int fd = -1;  // -1 once the Serve thread closed it (under mu_)
    bool done = false;
    std::thread thread;
  };
  // A table entry: a range of this region (a write's destination or a
  // read's source).
  struct FrameSegment {
    uint64_t offset;
    uint64_t bytes;
  };

  void AcceptLoop() EXCLUDES(mu_);

  // Joins the threads of finished connections.
  void ReapLocked() REQUIRES(mu_);

  void Serve(Conn& c, int fd) EXCLUDES(mu_);

  bool Discard(int fd, uint64_t n, std::vector<uint8_t>& scratch);

  // True if `table` allows `transfer` every block of every plane that
  // [offset, offset+bytes) touches. REQUIRES: bytes > 0, inside the region.
  template <typename Table>
  bool Granted(const Table& table, TransferId transfer, uint64_t offset, uint64_t bytes) const;

  template <typename Table>
  bool AllGranted(const Table& table, TransferId transfer,
                  const std::vector<FrameSegment>& segments) const;

  // One write frame or read request; false when the connection must close.
  bool ServeFrame(int fd, std::vector<uint8_t>& table, std::vector<FrameSegment>& segments,
                  std::vector<uint8_t>& scratch);

  // A read request whose table has arrived: refused or malformed requests
  // get a head saying so and nothing else (the stream stays in step);
  // otherwise the head, the bytes straight from the region, and a trailer
  // that says whether the read grant held until the last byte was sent.
  bool ServeRead(int fd, TransferId transfer, const std::vector<FrameSegment>& segments,
                 uint64_t total, bool malformed, bool in_region);

  uint8_t* const base_;
  const RegionLayout layout_;
  std::vector<uint8_t> registration_;  // set by Start, then constant
  GrantTable grants_;
  ReadGrantTable read_grants_;
  const std::shared_ptr<TransportStats> stats_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread accept_thread_;

  Mutex mu_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::list<Conn> conns_ GUARDED_BY(mu_);  // a list: entries stay put
};


}  // namespace kvrelay::net::tcp
