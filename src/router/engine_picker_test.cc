#include "router/engine_picker.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace kvrelay::router {
namespace {

TEST(EnginePickerTest, EmptyOrNoneEligibleGivesNothing) {
  size_t cursor = 0;
  EXPECT_FALSE(PickLeastLoaded({}, &cursor).has_value());
  std::vector<PickCandidate> c = {{0, false}, {3, false}};
  EXPECT_FALSE(PickLeastLoaded(c, &cursor).has_value());
  EXPECT_EQ(cursor, 0u);
}

TEST(EnginePickerTest, PicksTheLeastOutstanding) {
  size_t cursor = 0;
  std::vector<PickCandidate> c = {{5, true}, {2, true}, {7, true}};
  EXPECT_EQ(PickLeastLoaded(c, &cursor), 1u);
  EXPECT_EQ(cursor, 2u);
  // The cursor only breaks ties: the least loaded wins wherever it is.
  c = {{1, true}, {4, true}, {4, true}};
  EXPECT_EQ(PickLeastLoaded(c, &cursor), 0u);
}

TEST(EnginePickerTest, SkipsIneligibleEvenWhenLeastLoaded) {
  size_t cursor = 0;
  std::vector<PickCandidate> c = {{0, false}, {9, true}, {3, true}};
  EXPECT_EQ(PickLeastLoaded(c, &cursor), 2u);
}

TEST(EnginePickerTest, RoundRobinOnTies) {
  size_t cursor = 0;
  std::vector<PickCandidate> c(3);   // all idle
  std::vector<size_t> got;
  for (int i = 0; i < 6; ++i) got.push_back(*PickLeastLoaded(c, &cursor));
  EXPECT_EQ(got, (std::vector<size_t>{0, 1, 2, 0, 1, 2}));
}

TEST(EnginePickerTest, RoundRobinOnlyAmongTheTied) {
  // Engines 0 and 2 tie at 1; engine 1 is busier. The cursor walks past 1.
  size_t cursor = 1;
  std::vector<PickCandidate> c = {{1, true}, {2, true}, {1, true}};
  EXPECT_EQ(PickLeastLoaded(c, &cursor), 2u);
  EXPECT_EQ(cursor, 0u);
  EXPECT_EQ(PickLeastLoaded(c, &cursor), 0u);
  EXPECT_EQ(PickLeastLoaded(c, &cursor), 2u);
}

TEST(EnginePickerTest, CursorBeyondTheListWraps) {
  size_t cursor = 17;   // e.g. the list shrank
  std::vector<PickCandidate> c(4);
  EXPECT_EQ(PickLeastLoaded(c, &cursor), 1u);   // 17 % 4
}

// Simulated load: picking and counting outstanding keeps engines within one
// of each other, and every engine gets work.
TEST(EnginePickerTest, SpreadsLoadEvenly) {
  size_t cursor = 0;
  std::vector<PickCandidate> c(5);
  std::map<size_t, int> picks;
  for (int i = 0; i < 103; ++i) {
    const size_t k = *PickLeastLoaded(c, &cursor);
    ++c[k].outstanding;
    ++picks[k];
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& x : c) {
      lo = std::min(lo, x.outstanding);
      hi = std::max(hi, x.outstanding);
    }
    ASSERT_LE(hi - lo, 1u);
  }
  EXPECT_EQ(picks.size(), 5u);
}

}  // namespace
}  // namespace kvrelay::router
