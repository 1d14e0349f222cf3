// auth_token_test.cc — LoadAuthToken refuses a missing, empty, too long or
// group/other-accessible file and strips a trailing newline.
#include "runtime/auth_token.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace kvrelay::runtime {
namespace {

std::string Write(const std::string& name, const std::string& body, mode_t mode) {
  const std::string path = ::testing::TempDir() + "/kvrelay-auth-" + std::to_string(getpid()) +
                           "-" + name;
  FILE* f = std::fopen(path.c_str(), "w");
  std::fwrite(body.data(), 1, body.size(), f);
  std::fclose(f);
  chmod(path.c_str(), mode);
  return path;
}

TEST(AuthTokenTest, ReadsAPrivateFileAndStripsTheNewline) {
  Result<std::string> t = LoadAuthToken(Write("ok", "s3cret\n", 0600));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t, "s3cret");
}

TEST(AuthTokenTest, RefusesWhatProtectsNothing) {
  EXPECT_EQ(LoadAuthToken("/nonexistent/kvrelay-token").status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_FALSE(LoadAuthToken(Write("empty", "\n", 0600)).ok());
  Result<std::string> group = LoadAuthToken(Write("group", "tok", 0640));
  ASSERT_FALSE(group.ok());
  EXPECT_NE(group.status().message().find("chmod 600"), std::string::npos);
  EXPECT_FALSE(LoadAuthToken(Write("other", "tok", 0604)).ok());
  EXPECT_FALSE(LoadAuthToken(Write("long", std::string(kMaxAuthTokenBytes + 1, 'x'), 0600)).ok());
  EXPECT_FALSE(LoadAuthToken(::testing::TempDir()).ok());  // a directory
}

}  // namespace
}  // namespace kvrelay::runtime
