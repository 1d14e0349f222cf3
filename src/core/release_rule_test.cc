// The release rule: only a request that failed, whose P leg is over and was
// P's to serve, releases P's transfer.
#include "core/release_rule.h"

#include <gtest/gtest.h>

namespace kvrelay {
namespace {

// A request that failed after P served its leg (D crashed before it pulled,
// D's leg failed, the client left) releases P's transfer.
TEST(ReleaseRuleTest, AFailedRequestWhosePLegIsOverReleases) {
  EXPECT_TRUE(RouterReleasesPrefill(true, true, RequestVerdict::kFailed));
}

// Shutdown: the router cancels D's leg and D releases over the wire itself;
// a rejected request never started a transfer; an open one may still be
// pulled; a refused P leg's transfer id may be another request's.
TEST(ReleaseRuleTest, TheCasesThatMustNotRelease) {
  EXPECT_FALSE(RouterReleasesPrefill(true, true, RequestVerdict::kShutdown));
  EXPECT_FALSE(RouterReleasesPrefill(true, true, RequestVerdict::kRejected));
  EXPECT_FALSE(RouterReleasesPrefill(true, true, RequestVerdict::kOpen));
  EXPECT_FALSE(RouterReleasesPrefill(true, true, RequestVerdict::kSucceeded));
  EXPECT_FALSE(RouterReleasesPrefill(true, false, RequestVerdict::kFailed));
  EXPECT_FALSE(RouterReleasesPrefill(false, true, RequestVerdict::kFailed));
}

}  // namespace
}  // namespace kvrelay
