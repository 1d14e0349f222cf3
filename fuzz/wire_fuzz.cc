// wire_fuzz.cc — libFuzzer target for the control channel's codec
// (core/wire.h, docs/wire.md): every frame a peer can send.
//
// Beyond "never crashes": a frame that decodes must re-encode to exactly its
// bytes and decode again to the same message (docs/wire.md, "A decoded
// message re-encodes to exactly the bytes it came from"), and tighter limits
// may only refuse more, with kOutOfRange, never accept something else.
// Seeds: fuzz/corpus/wire (fuzz_make_corpus), dictionary: wire.dict.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/check.h"
#include "core/wire.h"

using kvrelay::DecodeWire;
using kvrelay::EncodeWire;
using kvrelay::Result;
using kvrelay::StatusCode;
using kvrelay::WireLimits;
using kvrelay::WireMessage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> frame(data, size);
  const WireLimits defaults;
  const Result<WireMessage> m = DecodeWire(frame, defaults);
  if (m.ok()) {
    const std::vector<uint8_t> again = EncodeWire(*m);
    KV_CHECK_MSG(again.size() == size && std::equal(again.begin(), again.end(), data),
                 "a decoded frame did not re-encode to its bytes");
    const Result<WireMessage> m2 = DecodeWire(again, defaults);
    KV_CHECK_MSG(m2.ok() && *m2 == *m, "a re-encoded frame did not decode to the same message");
  } else {
    KV_CHECK(!m.status().message().empty());
  }

  WireLimits tight;
  tight.max_frame_bytes = 4096;
  tight.max_items_per_pull = 3;
  tight.max_blocks_per_item = 5;
  tight.max_registration_bytes = 32;
  const Result<WireMessage> t = DecodeWire(frame, tight);
  if (t.ok()) {
    KV_CHECK_MSG(m.ok() && *t == *m, "tighter limits accepted what the defaults refuse");
  } else if (m.ok()) {
    KV_CHECK_MSG(t.status().code() == StatusCode::kOutOfRange,
                 "tighter limits refused a valid frame for something other than a limit");
  }
  return 0;
}
