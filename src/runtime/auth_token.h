// auth_token.h — LoadAuthToken: reads the shared secret of
// `--auth-token-file` and refuses a file that is unsafe or unusable.
//
// Why: the token authenticates control-channel peers and admin HTTP calls
// (docs/operations.md, "Access control"). A token others on the host can
// read protects nothing, and an empty one would silently mean "no
// authentication"; both are refused with an error naming the file and the
// fix, so a misconfigured engine does not start.
//
// Rules: a regular file, no permission bits for group or others (chmod
// 600), 1..4096 bytes once trailing whitespace (a final newline) is
// removed. The token's bytes are used as they are (any text or binary).
//
// Thread safety: any thread.
#pragma once

#include <string>

#include "base/result.h"

namespace kvrelay::runtime {

inline constexpr size_t kMaxAuthTokenBytes = 4096;

Result<std::string> LoadAuthToken(const std::string& path);

}  // namespace kvrelay::runtime
