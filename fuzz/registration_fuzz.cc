// registration_fuzz.cc — libFuzzer target for the transports' registration
// decoders (the bytes of HandshakeMsg::registration: net/registration_codec.h
// over shm_transport.cc, tcp_stream.h, ucx_transport.cc).
//
// Every input is offered to all three decoders. One that accepts it must
// re-encode it to exactly its bytes (each format has one encoding).
// Seeds: fuzz/corpus/registration (fuzz_make_corpus).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/check.h"
#include "net/registration_codec.h"

using kvrelay::Result;
using kvrelay::StatusCode;
using kvrelay::net::ReencodeRegistration;
using kvrelay::net::TransportKind;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  int accepted = 0;
  for (TransportKind kind : {TransportKind::kShm, TransportKind::kTcp, TransportKind::kUcx}) {
    const Result<std::vector<uint8_t>> r = ReencodeRegistration(kind, in);
    if (!r.ok()) {
      KV_CHECK(r.status().code() == StatusCode::kInvalidArgument);
      continue;
    }
    ++accepted;
    KV_CHECK_MSG(r->size() == size && std::equal(r->begin(), r->end(), data),
                 "a registration did not re-encode to its bytes");
  }
  // The three formats have distinct magics: no input is two of them.
  KV_CHECK(accepted <= 1);
  return 0;
}
