#include "runtime/local_lane.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace kvrelay::runtime {
namespace {

std::string UniqueAddress(const std::string& test) {
  return "kvrelay-test/" + std::to_string(getpid()) + "/" + test;
}

std::vector<uint8_t> Frame(size_t size, uint8_t seed) {
  std::vector<uint8_t> f(size);
  for (size_t i = 0; i < size; ++i) f[i] = static_cast<uint8_t>(seed + i * 7);
  return f;
}

// A connected pair: `d` connected, `p` accepted.
struct Pair {
  std::unique_ptr<LaneListener> listener;
  std::unique_ptr<LocalLane> d, p;
};

Pair Connect(const std::string& name, const LaneLimits& limits = {}) {
  Pair pair;
  auto l = LaneListener::Bind(UniqueAddress(name));
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  pair.listener = std::move(*l);
  auto d = LocalLane::Connect(UniqueAddress(name), limits);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  pair.d = std::move(*d);
  const int fd = pair.listener->Accept();
  EXPECT_GE(fd, 0);
  pair.p = std::make_unique<LocalLane>(fd, limits);
  return pair;
}

// Reads `lane` (flushing `writer` between polls) until `want` frames came
// or the lane broke.
std::vector<std::vector<uint8_t>> ReadFrames(LocalLane& lane, LocalLane* writer, size_t want) {
  std::vector<std::vector<uint8_t>> got;
  for (int spins = 0; got.size() < want && !lane.broken() && spins < 100000; ++spins) {
    if (writer != nullptr) writer->Flush();
    pollfd pfd{lane.fd(), POLLIN, 0};
    poll(&pfd, 1, 10);
    lane.Read([&](const uint8_t* d, size_t n) { got.emplace_back(d, d + n); });
  }
  return got;
}

TEST(LaneAttach, RoundTripsAndRefusesOtherFrames) {
  const std::vector<uint8_t> f = LaneAttachFrame("3:1:7");
  ASSERT_EQ(ParseLaneAttach(f.data(), f.size()).value_or("?"), "3:1:7");
  const std::vector<uint8_t> bare = LaneAttachFrame("");
  EXPECT_FALSE(ParseLaneAttach(bare.data(), bare.size()));
  const std::vector<uint8_t> other = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_FALSE(ParseLaneAttach(other.data(), other.size()));
  const std::vector<uint8_t> huge = LaneAttachFrame(std::string(300, 'x'));
  EXPECT_FALSE(ParseLaneAttach(huge.data(), huge.size()));
}

TEST(LaneAddress, NamesEngineRankAndPort) {
  EXPECT_EQ(LaneAddress(2, 1, 7001), "kvrelay/lane/e2/r1/p7001");
  EXPECT_NE(LaneAddress(2, 1, 7001), LaneAddress(3, 1, 7001));
}

// Both ends learn the other's process from the kernel (here: this one).
TEST(LocalLane, EachEndKnowsThePeersProcess) {
  Pair pair = Connect("pid");
  EXPECT_EQ(pair.d->peer_pid(), getpid());
  EXPECT_EQ(pair.p->peer_pid(), getpid());
  EXPECT_FALSE(pair.d->PeerProcessGone());
}

// ProcessGone is proof of death only: a live process is not gone, a killed
// one is once the kernel made it a zombie, and stays so once reaped.
TEST(ProcessGone, OnlyForAProcessTheKernelEnded) {
  EXPECT_FALSE(ProcessGone(0));
  EXPECT_FALSE(ProcessGone(getpid()));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  EXPECT_FALSE(ProcessGone(child));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  bool gone = false;
  for (int i = 0; i < 1000 && !gone; ++i) {  // a zombie within ms
    gone = ProcessGone(child);
    if (!gone) usleep(1000);
  }
  EXPECT_TRUE(gone) << "a killed, unreaped child is a zombie";
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(ProcessGone(child)) << "reaped: no such pid";
}

TEST(LocalLane, FramesArriveWholeAndInOrderBothWays) {
  Pair pair = Connect("order");
  std::vector<std::vector<uint8_t>> sent;
  for (uint8_t i = 0; i < 50; ++i) {
    sent.push_back(Frame(1 + i * 13, i));
    ASSERT_EQ(pair.d->Send(sent.back()), LocalLane::SendResult::kSent);
  }
  EXPECT_EQ(ReadFrames(*pair.p, pair.d.get(), sent.size()), sent);
  const std::vector<uint8_t> answer = Frame(33, 9);
  ASSERT_EQ(pair.p->Send(answer), LocalLane::SendResult::kSent);
  EXPECT_EQ(ReadFrames(*pair.d, pair.p.get(), 1), std::vector<std::vector<uint8_t>>{answer});
}

TEST(LocalLane, AFrameLargerThanTheSocketBufferGoesOutInPieces) {
  Pair pair = Connect("large");
  const std::vector<uint8_t> big = Frame(8u << 20, 1), small = Frame(10, 2);
  ASSERT_EQ(pair.d->Send(big), LocalLane::SendResult::kSent);
  ASSERT_EQ(pair.d->Send(small), LocalLane::SendResult::kSent);
  EXPECT_TRUE(pair.d->wants_write());  // the socket could not take 8 MiB at once
  const auto got = ReadFrames(*pair.p, pair.d.get(), 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], big);
  EXPECT_EQ(got[1], small);
  EXPECT_FALSE(pair.d->wants_write());
}

// Frames of many sizes (some larger than a read's room, some crossing the
// buffer's end), read a few at a time: the buffer compacts and grows under
// them and every frame arrives whole and in order.
TEST(LocalLane, FramesAcrossTheReadBuffersEdgesArriveWhole) {
  Pair pair = Connect("edges");
  std::vector<std::vector<uint8_t>> sent, got;
  for (uint32_t i = 0; i < 600; ++i) {
    const size_t size = i % 50 == 7 ? 700'000 + i : 1 + (i * 7919u) % 70'000;
    sent.push_back(Frame(size, static_cast<uint8_t>(i)));
  }
  size_t next = 0;
  for (int spins = 0; got.size() < sent.size() && !pair.p->broken() && spins < 200000; ++spins) {
    while (next < sent.size() && pair.d->queued_frames() < 8) {
      ASSERT_EQ(pair.d->Send(sent[next++]), LocalLane::SendResult::kSent);
    }
    pair.d->Flush();
    pollfd pfd{pair.p->fd(), POLLIN, 0};
    poll(&pfd, 1, 1);
    pair.p->Read([&](const uint8_t* d, size_t n) { got.emplace_back(d, d + n); }, 3);
  }
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) ASSERT_EQ(got[i], sent[i]) << "frame " << i;
}

TEST(LocalLane, TheQueueIsBounded) {
  LaneLimits limits;
  limits.max_bytes = 5u << 20;
  Pair pair = Connect("bounded", limits);
  ASSERT_EQ(pair.d->Send(Frame(4u << 20, 1)), LocalLane::SendResult::kSent);
  EXPECT_EQ(pair.d->Send(Frame(4u << 20, 2)), LocalLane::SendResult::kQueueFull);
  EXPECT_FALSE(pair.d->broken());
  LaneLimits by_frames;
  by_frames.max_frames = 1;
  Pair two = Connect("bounded-frames", by_frames);
  ASSERT_EQ(two.d->Send(Frame(4u << 20, 1)), LocalLane::SendResult::kSent);
  EXPECT_EQ(two.d->Send(Frame(1, 2)), LocalLane::SendResult::kQueueFull);
}

TEST(LocalLane, AFrameOverTheLimitBreaksTheReader) {
  LaneLimits small;
  small.max_frame_bytes = 100;
  Pair pair = Connect("limit", small);
  ASSERT_EQ(pair.d->Send(Frame(101, 1)), LocalLane::SendResult::kSent);
  EXPECT_TRUE(ReadFrames(*pair.p, nullptr, 1).empty());
  EXPECT_TRUE(pair.p->broken());
  EXPECT_NE(pair.p->why_broken().find("max_frame_bytes 100"), std::string::npos);
}

TEST(LocalLane, FramesSentBeforeAClosePassThenTheLaneBreaks) {
  Pair pair = Connect("close");
  ASSERT_EQ(pair.d->Send(Frame(5, 1)), LocalLane::SendResult::kSent);
  ASSERT_EQ(pair.d->Send(Frame(6, 2)), LocalLane::SendResult::kSent);
  pair.d.reset();
  const auto got = ReadFrames(*pair.p, nullptr, 3);
  EXPECT_EQ(got.size(), 2u);
  EXPECT_TRUE(pair.p->broken());
  EXPECT_EQ(pair.p->why_broken(), "closed by the peer");
  EXPECT_TRUE(pair.p->peer_closed());
  EXPECT_EQ(pair.p->Send(Frame(1, 1)), LocalLane::SendResult::kBroken);
}

TEST(LocalLane, SendingToAClosedPeerBreaksTheSender) {
  Pair pair = Connect("epipe");
  pair.p.reset();
  LocalLane::SendResult r = LocalLane::SendResult::kSent;
  for (int i = 0; i < 10 && r == LocalLane::SendResult::kSent; ++i) r = pair.d->Send(Frame(64, 1));
  EXPECT_EQ(r, LocalLane::SendResult::kBroken);
  EXPECT_TRUE(pair.d->broken());
}

TEST(LocalLane, ReadStopsAtMaxFramesAndSaysWhatIsBuffered) {
  Pair pair = Connect("buffered");
  for (uint8_t i = 0; i < 3; ++i) {
    ASSERT_EQ(pair.d->Send(Frame(8, i)), LocalLane::SendResult::kSent);
  }
  size_t n = 0;
  for (int spins = 0; n == 0 && spins < 1000; ++spins) {
    pollfd pfd{pair.p->fd(), POLLIN, 0};
    poll(&pfd, 1, 10);
    n = pair.p->Read([](const uint8_t*, size_t) {}, 1);
  }
  ASSERT_EQ(n, 1u);
  // All three sat in one read; two are whole and buffered, none on the socket.
  for (int spins = 0; spins < 100 && !pair.p->has_buffered_frame(); ++spins) {
    pair.p->Read([](const uint8_t*, size_t) {}, 0);
  }
  EXPECT_TRUE(pair.p->has_buffered_frame());
  EXPECT_EQ(pair.p->Read([](const uint8_t*, size_t) {}, 5), 2u);
  EXPECT_FALSE(pair.p->has_buffered_frame());
}

TEST(LocalLane, BreakingInsideTheFrameCallbackEndsTheRead) {
  Pair pair = Connect("break-inside");
  for (uint8_t i = 0; i < 3; ++i) {
    ASSERT_EQ(pair.d->Send(Frame(16, i)), LocalLane::SendResult::kSent);
  }
  std::vector<std::vector<uint8_t>> got;
  for (int spins = 0; got.empty() && spins < 1000; ++spins) {
    pollfd pfd{pair.p->fd(), POLLIN, 0};
    poll(&pfd, 1, 10);
    pair.p->Read([&](const uint8_t* d, size_t n) {
      got.emplace_back(d, d + n);
      pair.p->Break("a bad frame");
      EXPECT_EQ(std::vector<uint8_t>(d, d + n), Frame(16, 0));  // still readable
    });
  }
  EXPECT_EQ(got.size(), 1u);
  EXPECT_TRUE(pair.p->broken());
  EXPECT_EQ(pair.p->why_broken(), "a bad frame");
  EXPECT_FALSE(pair.p->peer_closed());
  EXPECT_FALSE(pair.p->has_buffered_frame());
  EXPECT_EQ(pair.p->Read([&](const uint8_t*, size_t) { ADD_FAILURE(); }), 0u);
}

TEST(LaneListener, AnAddressIsBoundOnceAndAMissingOneRefusesConnect) {
  auto first = LaneListener::Bind(UniqueAddress("twice"));
  ASSERT_TRUE(first.ok());
  auto second = LaneListener::Bind(UniqueAddress("twice"));
  EXPECT_FALSE(second.ok());
  auto none = LocalLane::Connect(UniqueAddress("nobody"), {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ((*first)->Accept(), -1);  // nothing waiting
}

}  // namespace
}  // namespace kvrelay::runtime
