// refused_handoff_test.cc — ParseRefusedHandoff reads only well-typed,
// in-range fields (a port or tp that would wrap is refused).
#include "server/refused_handoff.h"

#include <gtest/gtest.h>

namespace kvrelay::server {
namespace {

std::string Body(const std::string& kv) {
  return R"({"prompt":"x","kv_transfer_params":{)" + kv + "}}";
}
const std::string kGood =
    R"("do_remote_prefill":true,"transfer_id":"0123456789abcdef0123456789abcdef",)"
    R"("remote_engine_id":7,"remote_host":"10.0.0.1","remote_port":9100,"remote_tp_size":2)";

TEST(RefusedHandoffTest, ReadsAWellFormedHandoff) {
  std::optional<RefusedHandoff> h = ParseRefusedHandoff(Body(kGood));
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->kv.remote_engine, 7u);
  EXPECT_EQ(h->kv.remote_tp, 2u);
  EXPECT_EQ(h->host, "10.0.0.1");
  EXPECT_EQ(h->port, 9100);
  EXPECT_TRUE(h->kv.do_remote_prefill);
  EXPECT_FALSE(h->kv.transfer.IsZero());
}

TEST(RefusedHandoffTest, RefusesWhatWouldWrapOrIsMistyped) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string kv = kGood;
    kv.replace(kv.find(from), from.size(), to);
    return Body(kv);
  };
  for (const std::string& body : {
           with("9100", "74636"),            // 65536 + 9100 would wrap to 9100
           with("9100", "0"), with("9100", "-1"), with("9100", "9100.5"),
           with("9100", "\"9100\""),
           with("\"remote_tp_size\":2", "\"remote_tp_size\":3"),
           with("\"remote_tp_size\":2", "\"remote_tp_size\":4294967298"),
           with("\"remote_engine_id\":7", "\"remote_engine_id\":4294967296"),
           with("true", "1"), with("true", "false"),
           with("\"10.0.0.1\"", "\"\""), with("\"10.0.0.1\"", "7"),
           with("0123456789abcdef0123456789abcdef", "00000000000000000000000000000000"),
           with("0123456789abcdef0123456789abcdef", "xyz"),
           std::string("not json"), std::string("[]"), std::string(R"({"kv_transfer_params":3})"),
       }) {
    EXPECT_FALSE(ParseRefusedHandoff(body).has_value()) << body;
  }
  EXPECT_FALSE(ParseRefusedHandoff(with("\"10.0.0.1\"", "\"" + std::string(300, 'h') + "\""))
                   .has_value());
}

}  // namespace
}  // namespace kvrelay::server
