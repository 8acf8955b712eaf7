// EcRec>Failpoint: kills its own process at a named point of a training step
// (tests of a step cut anywhere; see tf_ecrec/step/failpoints.py).
//
// It fires when TF_ECREC_FAILPOINT holds an entry "<point>@<task>@step=<n>"
// (entries comma-separated) whose <point> is the `point` attr, whose <task> is
// TF_ECREC_TASK (set by each tf_ecrec task process), with the step input >= n.  A marker file created with O_EXCL in
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
    EC_REQUIRES_OK(ctx, ctx->GetAttr("point", &point_));
  }

  void Compute(OpKernelContext* ctx) override {
    EC_REQUIRES_OK(ctx, ScalarOutput<int32>(ctx, 0, 0));
    const char* spec = std::getenv("TF_ECREC_FAILPOINT");
    const char* task = std::getenv("TF_ECREC_TASK");
    if (spec == nullptr || task == nullptr) return;
    const int64_t step = ctx->input(0).scalar<int64_t>()();
    // Comma-separated entries; the first naming this point and task whose step has come fires.
    const std::string all(spec);
    size_t begin = 0;
    while (begin <= all.size()) {
      size_t end = all.find(',', begin);
      if (end == std::string::npos) end = all.size();
      const std::string s = all.substr(begin, end - begin);
      begin = end + 1;
      const size_t first = s.find('@');
      if (first == std::string::npos) continue;
      const size_t second = s.find("@step=", first + 1);
      if (second == std::string::npos) continue;
      if (s.substr(0, first) != point_) continue;
      const std::string target = s.substr(first + 1, second - first - 1);
      if (target != task) continue;
      if (step < std::atoll(s.c_str() + second + 6)) continue;
      Fire(target, step);
      return;
    }
  }

 private:
  // Kills this process unless the (point, task) marker shows it fired already in this job.
  void Fire(const std::string& target, int64_t step) {
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

  std::string point_;
};

REGISTER_KERNEL_BUILDER(Name("EcRec>Failpoint").Device(DEVICE_CPU), FailpointOp);

}  // namespace ec_rec
}  // namespace tensorflow
