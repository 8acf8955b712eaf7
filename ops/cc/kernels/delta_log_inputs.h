// Op-input plumbing shared by the kernels that write or read a delta log:
// look the log up (creating it), read a logged op's ids, keep a delta tensor
// the log may hold on to.

#ifndef TF_ECREC_OPS_CC_KERNELS_DELTA_LOG_INPUTS_H_
#define TF_ECREC_OPS_CC_KERNELS_DELTA_LOG_INPUTS_H_

#include <string>

#include "ops/cc/kernels/delta_log.h"
#include "ops/cc/kernels/op_inputs.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/refcount.h"

namespace tensorflow {
namespace ec_rec {

// The log behind the handle at `input`, created empty on first use.
Status LookupOrCreateDeltaLog(OpKernelContext* ctx, int input,
                              core::RefCountPtr<DeltaLog>* log);

// `t` itself if TensorFlow owns its buffer (nobody writes a buffer with a
// second reference, so the log may keep it), else a copy in `*out`: a
// graph-mode feed may borrow the caller's NumPy array, which the caller may
// overwrite after the step. Call it before writing anything: it allocates.
Status ShareOrCopy(OpKernelContext* ctx, const Tensor& t, Tensor* out);

// Reads the `bypass_fence` attr of a logged op.
inline Status ReadBypassFence(OpKernelConstruction* ctx, bool* bypass) {
  return ctx->GetAttr("bypass_fence", bypass);
}

// The log at input 0 and the key (VariableKey) of the variable group whose
// first variable is input 1: the inputs of the recovery-view ops.
Status LookupLogAndKey(OpKernelContext* ctx, core::RefCountPtr<DeltaLog>* log,
                       std::string* key);

// A new entry of `kind` carrying the ids of `tag`.
inline DeltaLog::Entry TaggedEntry(const DeltaLog::Tag& tag,
                                   DeltaLog::Kind kind) {
  DeltaLog::Entry entry;
  entry.sid = tag.sid;
  entry.target = tag.target;
  entry.source = tag.source;
  entry.source_seq = tag.source_seq;
  entry.kind = kind;
  return entry;
}

// Reads the log handle at `first`, the int64 scalar sid at first + 1, the
// int32 scalar target at first + 2 and, if `with_source`, the int32 scalar
// source at first + 3 and the int64 scalar source_seq at first + 4; checks
// target >= 0 and source >= -1.
Status ReadLogInputs(OpKernelContext* ctx, int first, bool with_source,
                     core::RefCountPtr<DeltaLog>* log, DeltaLog::Tag* tag,
                     bool with_source_seq = false);

// A kernel that runs `Run` on the log at input 0.
template <Status (*Run)(OpKernelContext*, DeltaLog*)>
class DeltaLogOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<DeltaLog> log;
    EC_REQUIRES_OK(ctx, LookupOrCreateDeltaLog(ctx, 0, &log));
    EC_REQUIRES_OK(ctx, Run(ctx, log.get()));
  }
};

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_DELTA_LOG_INPUTS_H_
