// make_corpus.cc — writes the binary seed corpora of the fuzz targets with
// the real encoders, so the seeds are valid frames of today's format:
//   DIR/wire/          one frame per message kind and shape (EncodeWire)
//   DIR/registration/  one registration per transport (shm and ucx from a
//                      real region, tcp from its codec)
// Usage: fuzz_make_corpus DIR (scripts/fuzz --make-corpus runs it into
// fuzz/corpus). Text seeds (JSON bodies, admin queries) are hand-written
// files in fuzz/corpus/ and are left alone.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/wire.h"
#include "net/tcp_stream.h"
#include "net/transport.h"

namespace {

using namespace kvrelay;

bool Write(const std::filesystem::path& dir, const std::string& name,
           const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return out.good();
}

HandshakeMsg Handshake(uint8_t transport, std::vector<uint8_t> registration) {
  HandshakeMsg h;
  h.engine_id = 8100;
  h.incarnation = 3;
  h.rank = 1;
  h.tp = 2;
  h.role = 1;
  h.transport = transport;
  h.layers = 4;
  h.kv_heads = 4;
  h.head_dim = 8;
  h.dtype_bytes = 2;
  h.block_tokens = 4;
  h.num_blocks = 64;
  h.registration = std::move(registration);
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  bool ok = true;

  // Registrations, from the transports themselves where they need a region.
  const net::RegionLayout layout{8, 16, 256};
  std::vector<std::pair<std::string, std::vector<uint8_t>>> regs;
  if (auto t = net::MakeShmTransport({}); t.ok()) {
    if (auto r = (*t)->CreateRegion("fuzzseed", layout); r.ok()) {
      regs.emplace_back("shm", (*r)->registration());
    }
  }
  regs.emplace_back("tcp", net::tcp::EncodeRegistration(
                               {"127.0.0.1", 9100, layout.bytes(), layout}));
  regs.emplace_back("tcp_v6", net::tcp::EncodeRegistration(
                                  {"fe80::1%eth0", 65535, layout.bytes(), layout}));
  if (auto t = net::MakeUcxTransport({}); t.ok()) {
    if (auto r = (*t)->CreateRegion("fuzzseed", layout); r.ok()) {
      regs.emplace_back("ucx", (*r)->registration());
    }
  } else {
    std::fprintf(stderr, "no ucx seed: %s\n", t.status().ToString().c_str());
  }
  for (const auto& [name, bytes] : regs) ok &= Write(root / "registration", name, bytes);

  // Wire frames: every type, each with a few shapes.
  std::vector<std::pair<std::string, WireMessage>> frames;
  frames.emplace_back("handshake_empty_reg", Handshake(0, {}));
  for (size_t i = 0; i < regs.size() && i < 3; ++i) {
    const uint8_t kind = regs[i].first == "shm" ? 0 : regs[i].first == "ucx" ? 2 : 1;
    frames.emplace_back("handshake_" + regs[i].first, Handshake(kind, regs[i].second));
  }
  PullMsg empty;
  empty.pull_seq = 2;
  frames.emplace_back("pull_empty", empty);
  PullMsg pull;
  pull.pull_seq = 4;
  pull.items.push_back(PullItem{TransferId{1, 2}, {BlockId{3, 1}, BlockId{4, 2}}, 99});
  pull.items.push_back(PullItem{TransferId{0xdead, 0xbeef}, {BlockId{0, 0}}, 0, 480'000'000'000});
  frames.emplace_back("pull_two_items", pull);
  PullMsg release;
  release.pull_seq = 5;
  release.items.push_back(PullItem{TransferId{5, 6}, {}, 0});
  frames.emplace_back("pull_release", release);
  for (int r = 0; r < kTransferResultCount; ++r) {
    frames.emplace_back("answer_" + std::to_string(r),
                        AnswerMsg{42, TransferId{1, 2}, static_cast<TransferResult>(r)});
  }
  frames.emplace_back("answer_ok_first_token",
                      AnswerMsg{42, TransferId{1, 2}, TransferResult::kOk, 1234});
  frames.emplace_back("heartbeat", HeartbeatMsg{3, 77});
  frames.emplace_back("lease", LeaseMsg{9, TransferId{1, 2}, 0x1234});
  frames.emplace_back("grant", GrantMsg{9, TransferId{1, 2}, LeaseAnswer::kGranted,
                                        TransferResult::kOk, 20'000'000'000,
                                        {BlockId{3, 1}, BlockId{4, 2}}});
  frames.emplace_back("revoke_abort", RevokeMsg{TransferId{5, 6}, TransferResult::kAborted});
  frames.emplace_back("revoke_reset", RevokeMsg{TransferId{5, 6}, TransferResult::kReset});
  frames.emplace_back("notice", NoticeMsg{TransferId{5, 6}, ReadNotice::kRevoked});
  for (const auto& [name, msg] : frames) ok &= Write(root / "wire", name, EncodeWire(msg));

  std::printf("wrote %zu registration and %zu wire seeds under %s\n", regs.size(),
              frames.size(), root.c_str());
  return ok ? 0 : 1;
}
