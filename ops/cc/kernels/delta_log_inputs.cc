// Inputs of the ops that use a delta log (see delta_log_inputs.h).

#include "ops/cc/kernels/delta_log_inputs.h"

#include <cstring>

#include "ops/cc/kernels/op_inputs.h"
#include "tensorflow/core/common_runtime/dma_helper.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {

Status ShareOrCopy(OpKernelContext* ctx, const Tensor& t, Tensor* out) {
  const TensorBuffer* buffer = DMAHelper::buffer(&t);
  if (t.NumElements() == 0 || buffer == nullptr || buffer->OwnsMemory()) {
    *out = t;
    return OkStatus();
  }
  TF_RETURN_IF_ERROR(ctx->allocate_temp(t.dtype(), t.shape(), out));
  std::memcpy(const_cast<char*>(out->tensor_data().data()),
              t.tensor_data().data(), t.TotalBytes());
  return OkStatus();
}

Status LookupOrCreateDeltaLog(OpKernelContext* ctx, int input,
                              core::RefCountPtr<DeltaLog>* log) {
  return LookupOrCreateResource<DeltaLog>(
      ctx, HandleFromInput(ctx, input), log, [](DeltaLog** created) {
        *created = new DeltaLog();
        return OkStatus();
      });
}

Status LookupLogAndKey(OpKernelContext* ctx, core::RefCountPtr<DeltaLog>* log,
                       std::string* key) {
  TF_RETURN_IF_ERROR(LookupOrCreateDeltaLog(ctx, 0, log));
  return VariableKey(ctx, 1, key);
}

Status ReadLogInputs(OpKernelContext* ctx, int first, bool with_source,
                     core::RefCountPtr<DeltaLog>* log, DeltaLog::Tag* tag,
                     bool with_source_seq) {
  TF_RETURN_IF_ERROR(ScalarInput(ctx, first + 1, "sid", &tag->sid));
  TF_RETURN_IF_ERROR(ScalarInput(ctx, first + 2, "target", &tag->target));
  tag->source = -1;
  tag->source_seq = -1;
  if (with_source) {
    TF_RETURN_IF_ERROR(ScalarInput(ctx, first + 3, "source", &tag->source));
  }
  if (with_source && with_source_seq) {
    TF_RETURN_IF_ERROR(
        ScalarInput(ctx, first + 4, "source_seq", &tag->source_seq));
  }
  if (tag->target < 0) {
    return errors::InvalidArgument("`target` must be >= 0, got ", tag->target);
  }
  if (tag->source < -1) {
    return errors::InvalidArgument("`source` must be >= -1, got ",
                                   tag->source);
  }
  return LookupOrCreateDeltaLog(ctx, first, log);
}

}  // namespace ec_rec
}  // namespace tensorflow
