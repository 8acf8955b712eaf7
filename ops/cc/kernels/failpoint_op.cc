// EcRec>Failpoint: kills its own process at a named point of a training step
// (tests of a step cut anywhere; see tf_ecrec/failpoints.py).
//
// It fires when TF_ECREC_FAILPOINT is "<point>@<task>@step=<n>", the `point`
// attr equals <point>, TF_ECREC_TASK (set by each tf_ecrec task process) equals
// <task> and the step input is >= n.  A marker file created with O_EXCL in
// TF_ECREC_FAILPOINT_DIR (default /tmp) makes it fire once per job.  Written
// in C++ so that it works in PS processes, where a Python py_func cannot run.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "ops/cc/kernels/op_inputs.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace ec_rec {

REGISTER_OP("EcRec>Failpoint")
    .Input("step: int64")
    .Output("out: int32")
    .Attr("point: string")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
Test hook: SIGKILLs this process when TF_ECREC_FAILPOINT names `point`, this
task (TF_ECREC_TASK) and a step <= `step`; otherwise outputs 0.
)doc");

class FailpointOp : public OpKernel {
 public:
  explicit FailpointOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("point", &point_));
  }

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, ScalarOutput<int32>(ctx, 0, 0));
    const char* spec = std::getenv("TF_ECREC_FAILPOINT");
    const char* task = std::getenv("TF_ECREC_TASK");
    if (spec == nullptr || task == nullptr) return;
    const std::string s(spec);
    const size_t first = s.find('@');
    const size_t second = s.find("@step=", first == std::string::npos ? 0 : first + 1);
    if (first == std::string::npos || second == std::string::npos) return;
    if (s.substr(0, first) != point_) return;
    const std::string target = s.substr(first + 1, second - first - 1);
    if (target != task) return;
    const long long at = std::atoll(s.c_str() + second + 6);
    const int64_t step = ctx->input(0).scalar<int64_t>()();
    if (step < at) return;
    const char* dir = std::getenv("TF_ECREC_FAILPOINT_DIR");
    std::string marker = std::string(dir ? dir : "/tmp") + "/tf_ecrec_failpoint_" + point_ + "_" + target;
    for (char& c : marker) {
      if (c == ':') c = '_';
    }
    const int fd = open(marker.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) return;  // fired already in this job
    const std::string when = std::to_string(step);
    if (write(fd, when.data(), when.size()) < 0) {
      // nothing to do: the marker's existence is what matters
    }
    close(fd);
    LOG(WARNING) << "failpoint " << point_ << ": killing " << target << " at global step " << step;
    kill(getpid(), SIGKILL);
  }

 private:
  std::string point_;
};

REGISTER_KERNEL_BUILDER(Name("EcRec>Failpoint").Device(DEVICE_CPU), FailpointOp);

}  // namespace ec_rec
}  // namespace tensorflow
