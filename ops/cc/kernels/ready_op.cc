// EcRec>RequireEmpty: the "model ready" check of a worker waiting for the chief.
// EcRec>AwaitInitialized: on a PS, waits (bounded) for a variable to exist.
//
// Stock ready ops report uninitialized variables and the session manager
// then sleeps 30 s before it checks again.  This op instead fails with
// ABORTED while its input lists any variable (after a short pause that
// rate-limits the retries), which a recoverable session treats like a
// preempted PS: it re-creates the session and checks again at once.
// (Not UNAVAILABLE: the distributed runtime turns an op's UNAVAILABLE into
// INTERNAL, which would end the worker.)

#include <algorithm>

#include "ops/cc/kernels/op_inputs.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/env.h"

namespace tensorflow {
namespace ec_rec {

REGISTER_OP("EcRec>RequireEmpty")
    .Input("names: string")
    .Output("empty: string")
    .Attr("retry_micros: int = 500000")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle names;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &names));
      c->set_output(0, names);
      return OkStatus();
    })
    .SetIsStateful()
    .Doc(R"doc(
Passes an empty list through; fails with ABORTED (after pausing
retry_micros) while `names` lists uninitialized variables.
)doc");

class RequireEmptyOp : public OpKernel {
 public:
  explicit RequireEmptyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("retry_micros", &retry_micros_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& names = ctx->input(0);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(names.shape()),
                errors::InvalidArgument("`names` must be a vector, got shape ",
                                        names.shape().DebugString()));
    if (names.NumElements() > 0) {
      ctx->env()->SleepForMicroseconds(retry_micros_);
      ctx->SetStatus(errors::Aborted(
          "waiting for the chief to initialise or rebuild ", names.NumElements(),
          " variables, e.g. ", names.vec<tstring>()(0)));
      return;
    }
    ctx->set_output(0, names);
  }

 private:
  int64_t retry_micros_;
};

REGISTER_KERNEL_BUILDER(Name("EcRec>RequireEmpty").Device(DEVICE_CPU),
                        RequireEmptyOp);

// Each ready check of a waiting worker is a new session, and a new session
// creates a worker session on every PS (device discovery under the PS's
// session lock), which stalls the chief's own calls on those PS during a
// recovery.  Waiting here, on the PS, for the marker that the chief writes
// last lets one check span the whole wait (up to `max_wait_micros`) instead
// of a session per half second.
REGISTER_OP("EcRec>AwaitInitialized")
    .Input("resource: resource")
    .Output("initialized: bool")
    .Attr("max_wait_micros: int = 2000000")
    .Attr("poll_micros: int = 5000")
    .SetShapeFn(shape_inference::ScalarShape)
    .SetIsStateful()
    .Doc(R"doc(
Whether the resource variable exists and is initialized, waiting up to
max_wait_micros (polling every poll_micros) for it to be; a cancelled step
stops waiting.
)doc");

// Asynchronous: a synchronous wait would hold one of the PS's few executor
// threads per waiting worker and starve the chief's recovery ops on that PS.
// Each poll is a closure scheduled on the environment's timer.
class AwaitInitializedOp : public AsyncOpKernel {
 public:
  explicit AwaitInitializedOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("max_wait_micros", &max_wait_micros_));
    EC_REQUIRES_OK(ctx, ctx->GetAttr("poll_micros", &poll_micros_));
    OP_REQUIRES(ctx, max_wait_micros_ >= 0 && poll_micros_ > 0,
                errors::InvalidArgument("max_wait_micros must be >= 0 and poll_micros > 0, got ",
                                        max_wait_micros_, " and ", poll_micros_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Poll(ctx, std::move(done), ctx->env()->NowMicros() + max_wait_micros_);
  }

 private:
  void Poll(OpKernelContext* ctx, DoneCallback done, uint64 deadline) {
    bool ready = false;
    {
      core::RefCountPtr<Var> var;
      if (LookupResource(ctx, HandleFromInput(ctx, 0), &var).ok()) {
        tf_shared_lock lock(*var->mu());
        ready = var->is_initialized;
      }
    }
    const uint64 now = ctx->env()->NowMicros();
    CancellationManager* cm = ctx->cancellation_manager();
    if (!ready && now < deadline && !(cm != nullptr && cm->IsCancelled())) {
      const int64_t pause = std::min<int64_t>(poll_micros_, deadline - now);
      ctx->env()->SchedClosureAfter(pause, [this, ctx, done = std::move(done), deadline]() mutable {
        Poll(ctx, std::move(done), deadline);
      });
      return;
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    out->scalar<bool>()() = ready;
    done();
  }

  int64_t max_wait_micros_;
  int64_t poll_micros_;
};

REGISTER_KERNEL_BUILDER(Name("EcRec>AwaitInitialized").Device(DEVICE_CPU),
                        AwaitInitializedOp);

}  // namespace ec_rec
}  // namespace tensorflow
