#include "server/kv_release.h"

#include <gtest/gtest.h>

namespace kvrelay::server {
namespace {

TEST(KvReleaseTest, TakesATransferId) {
  const std::string id = "0123456789abcdef0123456789abcdef";
  Result<TransferId> t = ParseKvRelease(R"({"transfer_id": ")" + id + "\"}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->ToString(), id);
}

TEST(KvReleaseTest, RefusesWhatIsNotOneTransferIdWithAReason) {
  struct Case {
    const char* body;
    const char* says;
  } cases[] = {
      {"", "not valid JSON"},
      {"[]", "JSON object"},
      {"{}", "transfer_id is required"},
      {R"({"transfer_id": 7})", "transfer_id is required"},
      {R"({"transfer_id": "xyz"})", "32 lowercase hex"},
      {R"({"transfer_id": "0123456789ABCDEF0123456789ABCDEF"})", "32 lowercase hex"},
      {R"({"transfer_id": "00000000000000000000000000000000"})", "all zeros"},
      {R"({"transfer_id": "0123456789abcdef0123456789abcdef", "all": true})",
       "unknown field \"all\""},
  };
  for (const Case& c : cases) {
    Result<TransferId> t = ParseKvRelease(c.body);
    ASSERT_FALSE(t.ok()) << c.body;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << c.body;
    EXPECT_NE(t.status().message().find(c.says), std::string::npos)
        << c.body << " -> " << t.status().message();
  }
}

}  // namespace
}  // namespace kvrelay::server
