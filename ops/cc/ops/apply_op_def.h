// The definition of an EcRec>SparseApply*WithDelta op and of its ...Logged
// variant: inputs, attrs, shape function and documentation. The contract the
// apply ops share is written in ops/cc/ops/ec_ops.cc.

#ifndef TF_ECREC_OPS_CC_OPS_APPLY_OP_DEF_H_
#define TF_ECREC_OPS_CC_OPS_APPLY_OP_DEF_H_

#include <vector>

#include "tensorflow/core/framework/op.h"

namespace tensorflow {
namespace ec_rec {

// The inputs, attrs and shape of an EcRec>SparseApply*WithDelta op. Its
// ...Logged variant has the same plus (log, sid, target) after the inputs and
// `bypass_fence` after Tindices.
struct ApplyOp {
  const char* name;
  const char* logged_name;
  std::vector<const char*> inputs;  // var, slots, then the op's own order
  std::vector<const char*> attrs;   // after Tindices (and bypass_fence)
  int num_tables;                   // var + slots, inputs [0, num_tables)
  std::vector<int> scalars;         // the float scalar inputs
  int grad_input;
  int indices_input;
};

// Registers `op`, documented by `doc`, and its logged variant.
InitOnStartupMarker RegisterApplyOps(const ApplyOp& op, const char* doc);

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_OPS_APPLY_OP_DEF_H_
