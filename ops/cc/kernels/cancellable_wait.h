// An asynchronous kernel's wait, ended by the step's cancellation.
//
// A step that fails (a PS died, its deadline passed) cancels its other
// partitions; a kernel still waiting (a commit behind an earlier step, a
// lookup behind a row being rebuilt) must then stop, or the session's close,
// and with it the trainer's recovery, waits for it.  The kernel and the
// cancellation callback meet only in shared state: once the wait is
// registered, the step's context may end at any moment.

#ifndef TF_ECREC_OPS_KERNELS_CANCELLABLE_WAIT_H_
#define TF_ECREC_OPS_KERNELS_CANCELLABLE_WAIT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/core/refcount.h"

namespace tensorflow {
namespace ec_rec {

// Starts a wait under `ctx`'s cancellation manager.
//
// `start(finish)` registers the wait and returns its id, or -1 when `finish`
// was already called (nothing to wait for); `finish(status)` must then be
// called exactly once, by whoever ends the wait.  `cancel(id)` ends a
// registered wait (calling its `finish` with a Cancelled status) and is a
// no-op for one that ended.  `owner` (holding the waits) is kept alive until
// the wait ends.
inline void CancellableWait(
    OpKernelContext* ctx, AsyncOpKernel::DoneCallback done,
    core::RefCounted* owner,
    const std::function<int64_t(std::function<void(const Status&)>)>& start,
    std::function<void(int64_t)> cancel) {
  CancellationManager* cm = ctx->cancellation_manager();
  CancellationToken token = CancellationManager::kInvalidToken;
  if (cm != nullptr) token = cm->get_cancellation_token();
  owner->Ref();  // released when the wait ends
  auto finish = [ctx, done, cm, token, owner](const Status& s) {
    if (cm != nullptr && token != CancellationManager::kInvalidToken) {
      cm->TryDeregisterCallback(token);
    }
    ctx->SetStatus(s);
    done();
    owner->Unref();
  };
  struct Shared {
    std::atomic<int64_t> id{-2};
    std::atomic<bool> cancelled{false};
  };
  auto state = std::make_shared<Shared>();
  // The callback holds `owner` for as long as the manager holds the callback.
  owner->Ref();
  std::shared_ptr<core::RefCounted> hold(owner,
                                         [](core::RefCounted* o) { o->Unref(); });
  // Registered before the wait, so that no cancellation comes between.
  if (cm != nullptr &&
      !cm->RegisterCallback(token, [state, cancel, hold]() {
        state->cancelled = true;
        const int64_t id = state->id.load();
        if (id >= 0) cancel(id);
      })) {
    ctx->SetStatus(errors::Cancelled("the step was cancelled"));
    done();
    owner->Unref();
    return;
  }
  const int64_t id = start(finish);
  state->id.store(id);
  // A cancellation before the id was stored found nothing to end.
  if (id >= 0 && state->cancelled.load()) cancel(id);
}

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_KERNELS_CANCELLABLE_WAIT_H_
