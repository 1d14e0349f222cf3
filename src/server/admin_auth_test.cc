// admin_auth_test.cc — the admin MAC, its header, and AdminAuth's verdicts:
// missing, malformed, unknown (replayed) nonce, bad MAC, ok.
#include "server/admin_auth.h"

#include <gtest/gtest.h>

namespace kvrelay::server {
namespace {

TEST(AdminAuthTest, MacBindsEveryPart) {
  const std::string base = AdminRequestMac("tok", "00", "POST", "/pause?mode=abort", "");
  EXPECT_EQ(base.size(), 64u);
  EXPECT_NE(base, AdminRequestMac("tok2", "00", "POST", "/pause?mode=abort", ""));
  EXPECT_NE(base, AdminRequestMac("tok", "01", "POST", "/pause?mode=abort", ""));
  EXPECT_NE(base, AdminRequestMac("tok", "00", "GET", "/pause?mode=abort", ""));
  EXPECT_NE(base, AdminRequestMac("tok", "00", "POST", "/pause?mode=wait", ""));
  EXPECT_NE(base, AdminRequestMac("tok", "00", "POST", "/pause?mode=abort", "{}"));
}

TEST(AdminAuthTest, HeaderRoundTrip) {
  const std::string nonce(32, 'a');
  const std::string h = AdminAuthorization("tok", nonce, "POST", "/resume", "");
  std::string n, m;
  ASSERT_TRUE(ParseAdminAuthorization(h, &n, &m));
  EXPECT_EQ(n, nonce);
  EXPECT_EQ(m, AdminRequestMac("tok", nonce, "POST", "/resume", ""));
  EXPECT_FALSE(ParseAdminAuthorization("Bearer tok", &n, &m));
  EXPECT_FALSE(ParseAdminAuthorization("KVRELAY-HMAC nonce=zz, mac=00", &n, &m));
}

TEST(AdminAuthTest, Verdicts) {
  AdminAuth auth("s3cret");
  ASSERT_TRUE(auth.enabled());
  EXPECT_EQ(auth.Verify("POST", "/resume", "", ""), AdminAuthVerdict::kMissing);
  EXPECT_EQ(auth.Verify("POST", "/resume", "", "Bearer s3cret"), AdminAuthVerdict::kMalformed);
  const std::string never(32, '0');
  EXPECT_EQ(auth.Verify("POST", "/resume", "",
                        AdminAuthorization("s3cret", never, "POST", "/resume", "")),
            AdminAuthVerdict::kUnknownNonce);
  std::string n = auth.IssueNonce();
  EXPECT_EQ(n.size(), 32u);
  EXPECT_EQ(auth.Verify("POST", "/resume", "",
                        AdminAuthorization("wrong", n, "POST", "/resume", "")),
            AdminAuthVerdict::kBadMac);
  // A nonce is consumed by any attempt, good or bad.
  EXPECT_EQ(auth.Verify("POST", "/resume", "",
                        AdminAuthorization("s3cret", n, "POST", "/resume", "")),
            AdminAuthVerdict::kUnknownNonce);
  n = auth.IssueNonce();
  const std::string good = AdminAuthorization("s3cret", n, "POST", "/resume", "");
  EXPECT_EQ(auth.Verify("POST", "/resume", "", good), AdminAuthVerdict::kOk);
  EXPECT_EQ(auth.Verify("POST", "/resume", "", good), AdminAuthVerdict::kUnknownNonce);
  // Signed for another call: refused.
  n = auth.IssueNonce();
  EXPECT_EQ(auth.Verify("POST", "/sleep", "",
                        AdminAuthorization("s3cret", n, "POST", "/resume", "")),
            AdminAuthVerdict::kBadMac);
  EXPECT_NE(auth.IssueNonce(), auth.IssueNonce());
}

TEST(AdminAuthTest, DisabledAcceptsEverything) {
  AdminAuth off("");
  EXPECT_EQ(off.Verify("POST", "/resume", "", ""), AdminAuthVerdict::kOk);
}

}  // namespace
}  // namespace kvrelay::server
