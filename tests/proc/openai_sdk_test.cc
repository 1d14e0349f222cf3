// openai_sdk_test.cc — kvrelay through the official `openai` npm client
// (pinned by scripts/openai-sdk), against the router of a 1P1D cluster and
// against an engine on its own: tests/openai/sdk_check.mjs runs the client's
// calls (completions with and without streaming, the usage chunk, an
// AbortController cancel, errors as APIError subclasses, 50 concurrent
// streams with 10 aborted, models.list()); afterwards every engine is idle
// with no block in use.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "proc/harness.h"

namespace kvrelay::proctest {
namespace {

using namespace std::chrono_literals;

// The folder scripts/openai-sdk installed the client into, or "".
std::string SdkDir() {
  const std::string script = std::string(KVRELAY_SOURCE_DIR) + "/scripts/openai-sdk --check";
  FILE* f = popen(script.c_str(), "r");
  if (f == nullptr) return "";
  char buf[4096];
  std::string out;
  while (fgets(buf, sizeof buf, f) != nullptr) out += buf;
  if (pclose(f) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// Runs sdk_check.mjs against `base_url`; its output goes to the test's log.
int RunCheck(const std::string& sdk, const std::string& base_url, const std::string& label) {
  const std::string cmd = "node " + std::string(KVRELAY_SOURCE_DIR) +
                          "/tests/openai/sdk_check.mjs '" + sdk + "' '" + base_url +
                          "' kvrelay-tiny '" + label + "' 2>&1";
  std::fflush(stdout);
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::unique_ptr<Engine> Start(const std::string& name, const std::string& role) {
  EngineConfig c;
  c.name = name;
  c.role = role;
  std::string err;
  std::unique_ptr<Engine> e = Engine::Start(c, &err);
  EXPECT_NE(e, nullptr) << err;
  return e;
}

TEST(OpenAiSdkTest, TheOfficialClientAgainstTheRouterAndAnEngine) {
  const std::string sdk = SdkDir();
  ASSERT_FALSE(sdk.empty()) << "the openai client is not installed: run scripts/openai-sdk "
                               "(scripts/test does)";
  std::unique_ptr<Engine> p = Start("P", "prefill");
  std::unique_ptr<Engine> d = Start("D", "decode");
  std::unique_ptr<Engine> plain = Start("plain", "plain");
  ASSERT_TRUE(p && d && plain);
  std::string err;
  std::unique_ptr<Router> r =
      Router::Start({UrlOf(p->http_port())}, {UrlOf(d->http_port())}, {}, &err);
  ASSERT_NE(r, nullptr) << err;

  EXPECT_EQ(RunCheck(sdk, UrlOf(r->port()), "router"), 0);
  EXPECT_EQ(RunCheck(sdk, UrlOf(plain->http_port()), "engine"), 0);

  for (Engine* e : {p.get(), d.get(), plain.get()}) {
    EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 15s))
        << e->config().name << " not idle: " << e->DebugState().dump();
  }
  // The aborts reached the engines as client disconnects.
  EXPECT_GE(MetricSum(d->Metrics(), "kvrelay_client_disconnects_total"), 11);
  EXPECT_GE(MetricSum(plain->Metrics(), "kvrelay_client_disconnects_total"), 11);
  EXPECT_EQ(r->Outcome("decode_failed") + r->Outcome("prefill_failed"), 0);
}

}  // namespace
}  // namespace kvrelay::proctest
