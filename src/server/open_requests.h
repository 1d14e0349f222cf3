// open_requests.h — OpenRequests: the engine server's index of its open
// requests by request id, and of the open P legs' transfers, for
// `/abort_requests`, client disconnects and the fast abort.
//
// Why: an abort names requests by id, and the engine knows a request only
// once its loop has added it (EngineActor::Submit returns after that). The
// server used to note a request's id after Submit returned. An abort that
// came after the engine had the request but before the handler's thread got
// the core back found no such id and was dropped: the request and its
// transfer ran to the end, as if never aborted. The window is from the
// engine loop adding the request to the handler's thread running again,
// which on saturated cores is a wait for a time slice (ms). Now a request
// is registered before Submit. An abort that finds it while it is being
// submitted is remembered, and `Submitted` tells the handler to abort it
// again once the engine has it (the engine may have taken the first abort
// before it had the request; an abort of an aborted request is a no-op).
// An abort that comes before `Register` finds nothing, as in vLLM: the
// request was not there yet.
//
// The transfer of a request still being submitted is not handed to the fast
// abort: if the engine refuses it (a transfer id that a live request already
// holds), that transfer is the other request's. The handler ends it after
// Submit, through the engine and the fast abort both.
//
// Ownership: one per EngineServer. Thread safety: any thread; one mutex,
// held only inside these calls.
// Invariants: every request in `submitting_` and in `aborted_early_` is
// registered; `aborted_early_` ⊆ `submitting_`; every map holds at most one
// entry per open request (the server's HTTP threads bound them).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/mutex.h"
#include "base/transfer_id.h"

namespace kvrelay::server {

class OpenRequests {
 public:
  // What an abort reaches now: the engine's client ids to abort, and the
  // transfers of open P legs the engine already holds (for the fast abort).
  struct Found {
    std::vector<uint64_t> clients;
    std::vector<TransferId> transfers;
  };

  // Before Submit. `transfer`: the request's P leg transfer, if it is one.
  // A request id given twice names the newer request from then on.
  void Register(const std::string& id, uint64_t client, std::optional<TransferId> transfer);

  // After Submit returned. `accepted`: the engine took the request; false
  // forgets it. Returns true when an abort named it meanwhile: the caller
  // must abort it again, in the engine and (its transfer) at the ranks.
  bool Submitted(const std::string& id, uint64_t client, bool accepted);

  // `/abort_requests`: the requests `ids` names, or every open one when
  // `all`. Requests still being submitted are not in the answer; they are
  // marked, and `Submitted` reports them.
  Found Abort(const std::vector<std::string>& ids, bool all);

  // The response ended (or the client left): forgets the request. Returns
  // its transfer if it was an open P leg the engine held.
  std::optional<TransferId> Release(const std::string& id, uint64_t client);

  size_t open() const;         // requests registered and not released
  size_t submitting() const;   // of them, not yet Submitted

  // Blocks until no request is open or `timeout` has passed; true if none
  // is open. EngineServer::Stop waits here for the aborted streams' last
  // chunks before it stops the listener.
  bool WaitUntilNoneOpen(std::chrono::milliseconds timeout);

 private:
  // Abort's part for one request: marks it if it is being submitted, else
  // adds its client (and transfer) to `found`.
  void TakeLocked(uint64_t client, Found* found) REQUIRES(mu_);

  // Forgets `client` as open; wakes WaitUntilNoneOpen when none is left.
  void CloseLocked(uint64_t client) REQUIRES(mu_);

  mutable Mutex mu_;
  CondVar none_open_;  // notified when open_ becomes empty
  std::unordered_map<std::string, uint64_t> client_of_id_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, TransferId> transfer_of_client_ GUARDED_BY(mu_);
  std::unordered_set<uint64_t> open_ GUARDED_BY(mu_);
  std::unordered_set<uint64_t> submitting_ GUARDED_BY(mu_);
  std::unordered_set<uint64_t> aborted_early_ GUARDED_BY(mu_);
};

}  // namespace kvrelay::server
