// open_requests_test.cc — OpenRequests: an abort is never lost between the
// engine taking a request and the server noting it, in every order of
// Register / Submit / Abort / Release.
#include "server/open_requests.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace kvrelay::server {
namespace {

const TransferId kT{1, 2};
const TransferId kU{3, 4};

TEST(OpenRequestsTest, AnAbortAfterSubmitFindsTheRequestAndItsTransfer) {
  OpenRequests r;
  r.Register("a", 7, kT);
  EXPECT_FALSE(r.Submitted("a", 7, true));
  const OpenRequests::Found f = r.Abort({"a"}, false);
  EXPECT_EQ(f.clients, std::vector<uint64_t>{7});
  EXPECT_EQ(f.transfers, std::vector<TransferId>{kT});
  EXPECT_EQ(r.Release("a", 7), kT);
  EXPECT_EQ(r.open(), 0u);
}

// The race the class exists for: the abort comes while Submit runs (the
// engine may or may not have the request yet). It is not handed out, since
// the engine may refuse the request, and Submitted says to abort again.
TEST(OpenRequestsTest, AnAbortDuringSubmitIsReportedBySubmitted) {
  OpenRequests r;
  r.Register("a", 7, kT);
  const OpenRequests::Found f = r.Abort({"a"}, false);
  EXPECT_TRUE(f.clients.empty());
  EXPECT_TRUE(f.transfers.empty());
  EXPECT_TRUE(r.Submitted("a", 7, true));
  // Once: a later abort finds it as an open request.
  const OpenRequests::Found g = r.Abort({"a"}, false);
  EXPECT_EQ(g.clients, std::vector<uint64_t>{7});
  EXPECT_EQ(r.Release("a", 7), kT);
}

TEST(OpenRequestsTest, AbortAllMarksRequestsBeingSubmittedToo) {
  OpenRequests r;
  r.Register("a", 7, kT);
  r.Register("b", 8, std::nullopt);
  r.Register("c", 9, kU);
  EXPECT_FALSE(r.Submitted("a", 7, true));
  EXPECT_FALSE(r.Submitted("b", 8, true));
  OpenRequests::Found f = r.Abort({}, true);
  std::sort(f.clients.begin(), f.clients.end());
  EXPECT_EQ(f.clients, (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(f.transfers, std::vector<TransferId>{kT});
  EXPECT_TRUE(r.Submitted("c", 9, true));
}

// A refused request is forgotten, and its transfer (which may be another
// request's) was never handed to the fast abort.
TEST(OpenRequestsTest, ARefusedRequestIsForgotten) {
  OpenRequests r;
  r.Register("a", 7, kT);
  EXPECT_TRUE(r.Abort({"a"}, false).transfers.empty());
  EXPECT_FALSE(r.Submitted("a", 7, false));  // nothing to abort: the engine has nothing
  EXPECT_EQ(r.open(), 0u);
  EXPECT_TRUE(r.Abort({"a"}, true).clients.empty());
}

TEST(OpenRequestsTest, AnAbortBeforeRegisterFindsNothing) {
  OpenRequests r;
  EXPECT_TRUE(r.Abort({"a"}, false).clients.empty());
  r.Register("a", 7, kT);
  EXPECT_FALSE(r.Submitted("a", 7, true));
}

// A request id given twice names the newer request; the older one's
// release leaves the newer one reachable.
TEST(OpenRequestsTest, AReusedIdNamesTheNewerRequest) {
  OpenRequests r;
  r.Register("a", 7, std::nullopt);
  EXPECT_FALSE(r.Submitted("a", 7, true));
  r.Register("a", 8, kU);
  EXPECT_FALSE(r.Submitted("a", 8, true));
  EXPECT_EQ(r.Abort({"a"}, false).clients, std::vector<uint64_t>{8});
  EXPECT_EQ(r.Release("a", 7), std::nullopt);
  EXPECT_EQ(r.Abort({"a"}, false).clients, std::vector<uint64_t>{8});
  EXPECT_EQ(r.Release("a", 8), kU);
  EXPECT_EQ(r.open(), 0u);
}

// Threads: every abort of a registered request is either found by Abort or
// reported by Submitted — never neither — whatever the interleaving.
TEST(OpenRequestsTest, ConcurrentAbortsAreNeverLost) {
  constexpr uint64_t kRequests = 2000;
  OpenRequests r;
  std::vector<int> reached(kRequests, 0);
  std::atomic<uint64_t> next{0};
  std::thread submitter([&] {
    for (uint64_t c = 0; c < kRequests; ++c) {
      r.Register(std::to_string(c), c, TransferId{c, 1});
      next.store(c + 1, std::memory_order_release);
      if (r.Submitted(std::to_string(c), c, true)) ++reached[c];
    }
  });
  std::thread aborter([&] {
    uint64_t done = 0;
    while (done < kRequests) {
      const uint64_t upto = next.load(std::memory_order_acquire);
      for (; done < upto; ++done) {
        for (uint64_t c : r.Abort({std::to_string(done)}, false).clients) ++reached[c];
      }
    }
  });
  submitter.join();
  aborter.join();
  for (uint64_t c = 0; c < kRequests; ++c) EXPECT_EQ(reached[c], 1) << c;
  EXPECT_EQ(r.submitting(), 0u);
}

TEST(OpenRequestsTest, WaitUntilNoneOpenReturnsWhenTheLastOneCloses) {
  using std::chrono::milliseconds;
  OpenRequests r;
  EXPECT_TRUE(r.WaitUntilNoneOpen(milliseconds(0)));  // nothing open: at once
  r.Register("a", 1, std::nullopt);
  r.Register("b", 2, std::nullopt);
  EXPECT_FALSE(r.WaitUntilNoneOpen(milliseconds(5)));  // open: times out
  ASSERT_FALSE(r.Submitted("a", 1, true));
  ASSERT_FALSE(r.Submitted("b", 2, false));  // refused: no longer open
  EXPECT_EQ(r.open(), 1u);
  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(20));
    r.Release("a", 1);
  });
  // Woken by the Release, long before its timeout.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(r.WaitUntilNoneOpen(milliseconds(60'000)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  closer.join();
  EXPECT_EQ(r.open(), 0u);
}

}  // namespace
}  // namespace kvrelay::server
