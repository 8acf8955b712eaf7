// Op definitions of the EcRec>SparseApply*WithDelta ops whose rules keep a
// momentum slot: Momentum, RMSProp and centered RMSProp. They follow the
// contract of the apply ops written in ec_ops.cc (the delta, duplicates,
// locks, validation before the first write, the ...Logged variants), take
// the inputs of their stock twins in the same order, and write the same bits
// (ops/cc/kernels/momentum_rules.h).

#include <vector>

#include "ops/cc/ops/apply_op_def.h"
#include "tensorflow/core/framework/op.h"

namespace tensorflow {
namespace ec_rec {
namespace {

// The inputs of the RMSProp ops; with `centered`, mg before ms.
std::vector<const char*> RmsPropInputs(bool centered) {
  std::vector<const char*> inputs = {"var: resource"};
  if (centered) inputs.push_back("mg: resource");
  for (const char* input :
       {"ms: resource", "mom: resource", "lr: float", "rho: float",
        "momentum: float", "epsilon: float", "grad: float",
        "indices: Tindices"}) {
    inputs.push_back(input);
  }
  return inputs;
}

}  // namespace

InitOnStartupMarker const kMomentumOps = RegisterApplyOps(
    {"EcRec>SparseApplyMomentumWithDelta",
     "EcRec>SparseApplyMomentumWithDeltaLogged",
     {"var: resource", "accum: resource", "lr: float", "grad: float",
      "indices: Tindices", "momentum: float"},
     {"use_nesterov: bool = false"}, 2, {2, 5}, 3, 4},
    R"doc(
Sparse Momentum step that returns the bitwise delta of the touched rows.

Per occurrence: accum = accum * momentum + grad, then var -= lr * accum, or
with use_nesterov var -= lr * grad + lr * momentum * accum; bit-identical to
ResourceSparseApplyMomentum (the sparse path of
tf.compat.v1.train.MomentumOptimizer).

var: float32 resource variable [rows, ...].
accum: float32 resource variable shaped like var, the momentum slot.
lr: learning rate, float32 scalar.
grad: float32 [n, ...], rows shaped like var's.
indices: [n] row ids in [0, rows).
momentum: float32 scalar.
use_nesterov: the stock kernel's attribute of that name.
delta: int32 [n, 2 * dim]; [var, accum] old ^ new bits at the first
  occurrence of each id, zeros at later occurrences.
)doc");

InitOnStartupMarker const kRmsPropOps = RegisterApplyOps(
    {"EcRec>SparseApplyRMSPropWithDelta",
     "EcRec>SparseApplyRMSPropWithDeltaLogged", RmsPropInputs(false), {}, 3,
     {3, 4, 5, 6}, 7, 8},
    R"doc(
Sparse RMSProp step that returns the bitwise delta of the touched rows.

Per occurrence:

  ms = ms * rho + grad^2 * (1 - rho)
  mom = mom * momentum + rsqrt(ms + epsilon) * lr * grad
  var -= mom

bit-identical to ResourceSparseApplyRMSProp (the sparse path of
tf.compat.v1.train.RMSPropOptimizer with centered=False).

var, ms, mom: float32 resource variables of one shape [rows, ...].
lr, rho, momentum, epsilon: float32 scalars.
grad: float32 [n, ...], rows shaped like var's.
indices: [n] row ids in [0, rows).
delta: int32 [n, 3 * dim]; [var, ms, mom] old ^ new bits at the first
  occurrence of each id, zeros at later occurrences.
)doc");

InitOnStartupMarker const kCenteredRmsPropOps = RegisterApplyOps(
    {"EcRec>SparseApplyCenteredRMSPropWithDelta",
     "EcRec>SparseApplyCenteredRMSPropWithDeltaLogged", RmsPropInputs(true),
     {}, 4, {4, 5, 6, 7}, 8, 9},
    R"doc(
Sparse centered RMSProp step that returns the bitwise delta of the rows.

Per occurrence:

  ms = ms * rho + grad^2 * (1 - rho)
  mg = mg * rho + grad * (1 - rho)
  mom = mom * momentum + rsqrt(ms + epsilon - mg^2) * lr * grad
  var -= mom

bit-identical to ResourceSparseApplyCenteredRMSProp (the sparse path of
tf.compat.v1.train.RMSPropOptimizer with centered=True).

var, mg, ms, mom: float32 resource variables of one shape [rows, ...].
lr, rho, momentum, epsilon: float32 scalars.
grad: float32 [n, ...], rows shaped like var's.
indices: [n] row ids in [0, rows).
delta: int32 [n, 4 * dim]; [var, mg, ms, mom] old ^ new bits at the first
  occurrence of each id, zeros at later occurrences.
)doc");

}  // namespace ec_rec
}  // namespace tensorflow
