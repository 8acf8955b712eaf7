// Inputs of the ops that use a delta log (see delta_log_inputs.h).

#include "ops/cc/kernels/delta_log_inputs.h"

#include <cstring>

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

Status ReadLogInputs(OpKernelContext* ctx, int first, bool with_source,
                     core::RefCountPtr<DeltaLog>* log, DeltaLog::Tag* tag,
                     bool with_source_seq) {
  const char* names[] = {"sid", "target", "source", "source_seq"};
  const int count = with_source ? (with_source_seq ? 4 : 3) : 2;
  for (int k = 0; k < count; ++k) {
    const Tensor& t = ctx->input(first + 1 + k);
    if (!TensorShapeUtils::IsScalar(t.shape())) {
      return errors::InvalidArgument("`", names[k], "` must be a scalar, got "
                                     "shape ",
                                     t.shape().DebugString());
    }
  }
  tag->sid = ctx->input(first + 1).scalar<int64_t>()();
  tag->target = ctx->input(first + 2).scalar<int32>()();
  tag->source = with_source ? ctx->input(first + 3).scalar<int32>()() : -1;
  tag->source_seq =
      with_source_seq ? ctx->input(first + 4).scalar<int64_t>()() : -1;
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
