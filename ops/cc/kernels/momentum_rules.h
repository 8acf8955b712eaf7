// Row update rules of the sparse optimizers with a momentum slot that report
// a bitwise delta: Momentum (plain and Nesterov), RMSProp and centered
// RMSProp. Same contract as the rules of optimizer_rules.h: one functor
// updates ONE row of var and of its slots for ONE occurrence of an index, and
// its arithmetic produces the same bits as the stock kernel it mirrors
// (compiled with TensorFlow's Eigen headers, AVX, no FMA):
//
//   Momentum         ResourceSparseApplyMomentum (use_nesterov false or true),
//                    the sparse path of tf.compat.v1.train.MomentumOptimizer.
//   RMSProp          ResourceSparseApplyRMSProp, the sparse path of
//                    tf.compat.v1.train.RMSPropOptimizer (centered=False).
//   CenteredRMSProp  ResourceSparseApplyCenteredRMSProp (centered=True).
//
// The stock kernels evaluate every row, width 1 included, with the same Eigen
// expression over `chip<0>` of the row-major [rows, dim] map (they have no
// scalar path), so the rules keep one path each, with the stock expression
// shapes: the product (rsqrt(ms + epsilon) * lr) * grad is not grad * lr /
// sqrt(ms + epsilon) (Eigen's vectorized rsqrt is an approximation refined by
// a Newton step), and (lr * momentum) * accum is not lr * (momentum * accum).
// Reordering any operation below breaks bit-identity with TensorFlow.

#ifndef TF_ECREC_OPS_CC_KERNELS_MOMENTUM_RULES_H_
#define TF_ECREC_OPS_CC_KERNELS_MOMENTUM_RULES_H_

#include <vector>

#include "ops/cc/kernels/op_inputs.h"
#include "ops/cc/kernels/optimizer_rules.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/errors.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tensorflow {
namespace ec_rec {

// accum = accum * momentum + grad, then
//   var -= lr * accum                                  (use_nesterov false)
//   var -= lr * grad + (lr * momentum) * accum         (use_nesterov true)
// with the inputs of ResourceSparseApplyMomentum: (var, accum, lr, grad,
// indices, momentum) and its `use_nesterov` attribute.
struct MomentumRule {
  static constexpr int kNumSlots = 1;
  static constexpr int kGradInput = 3;
  static constexpr int kIndicesInput = 4;
  static constexpr int kCyclesPerElement = 4;
  static std::vector<const char*> VariableNames() { return {"var", "accum"}; }

  struct Hyper {
    float lr, momentum;
  };

  explicit MomentumRule(OpKernelConstruction* ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("use_nesterov", &use_nesterov_));
  }

  Status Read(OpKernelContext* ctx, Hyper* h) const {
    TF_RETURN_IF_ERROR(ReadScalar(ctx, 2, "lr", &h->lr));
    return ReadScalar(ctx, 5, "momentum", &h->momentum);
  }

  void ApplyRow(const Hyper& h, const std::vector<Rows>& tables, int64_t row,
                const ConstRows& grads, int64_t i) const {
    Rows var_rows = tables[0];
    Rows accum_rows = tables[1];
    ConstRows grad_rows = grads;
    auto var = var_rows.chip<0>(row);
    auto accum = accum_rows.chip<0>(row);
    auto grad = grad_rows.chip<0>(i);
    accum = accum * accum.constant(h.momentum) + grad;
    if (use_nesterov_) {
      var -= grad.constant(h.lr) * grad +
             accum.constant(h.lr) * accum.constant(h.momentum) * accum;
    } else {
      var -= accum.constant(h.lr) * accum;
    }
  }

 private:
  bool use_nesterov_ = false;
};

// RMSProp, as ResourceSparseApplyRMSProp (kCentered = false; inputs var, ms,
// mom, lr, rho, momentum, epsilon, grad, indices) and
// ResourceSparseApplyCenteredRMSProp (kCentered = true; var, mg, ms, mom,
// then the same):
//
//   ms  = ms * rho + grad^2 * (1 - rho)
//   mg  = mg * rho + grad * (1 - rho)                            (centered)
//   mom = mom * momentum + rsqrt(ms + epsilon) * lr * grad
//   mom = mom * momentum + rsqrt(ms + epsilon - mg^2) * lr * grad (centered)
//   var -= mom
//
// The stock kernels check no value of the hyperparameters; neither does this.
template <bool kCentered>
struct RmsPropRule {
  static constexpr int kNumSlots = kCentered ? 3 : 2;
  static constexpr int kFirstScalar = 1 + kNumSlots;  // lr
  static constexpr int kGradInput = kFirstScalar + 4;
  static constexpr int kIndicesInput = kGradInput + 1;
  static constexpr int kCyclesPerElement = kCentered ? 24 : 18;
  static std::vector<const char*> VariableNames() {
    if (kCentered) return {"var", "mg", "ms", "mom"};
    return {"var", "ms", "mom"};
  }

  struct Hyper {
    float lr, rho, momentum, epsilon;
  };

  explicit RmsPropRule(OpKernelConstruction*) {}

  Status Read(OpKernelContext* ctx, Hyper* h) const {
    TF_RETURN_IF_ERROR(ReadScalar(ctx, kFirstScalar, "lr", &h->lr));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, kFirstScalar + 1, "rho", &h->rho));
    TF_RETURN_IF_ERROR(
        ReadScalar(ctx, kFirstScalar + 2, "momentum", &h->momentum));
    return ReadScalar(ctx, kFirstScalar + 3, "epsilon", &h->epsilon);
  }

  void ApplyRow(const Hyper& h, const std::vector<Rows>& tables, int64_t row,
                const ConstRows& grads, int64_t i) const {
    constexpr int kMs = kCentered ? 2 : 1;
    Rows var_rows = tables[0];
    Rows ms_rows = tables[kMs];
    Rows mom_rows = tables[kMs + 1];
    ConstRows grad_rows = grads;
    auto ms = ms_rows.chip<0>(row);
    auto mom = mom_rows.chip<0>(row);
    auto grad = grad_rows.chip<0>(i);
    const float one_minus_rho = 1.0f - h.rho;
    ms = ms * ms.constant(h.rho) + grad.square() * grad.constant(one_minus_rho);
    if (kCentered) {
      Rows mg_rows = tables[1];
      auto mg = mg_rows.chip<0>(row);
      mg = mg * mg.constant(h.rho) + grad * grad.constant(one_minus_rho);
      auto denom = ms + ms.constant(h.epsilon) - mg.square();
      mom = mom * mom.constant(h.momentum) +
            denom.rsqrt() * ms.constant(h.lr) * grad;
    } else {
      mom = mom * mom.constant(h.momentum) +
            (ms + ms.constant(h.epsilon)).rsqrt() * ms.constant(h.lr) * grad;
    }
    auto var = var_rows.chip<0>(row);
    var -= mom;
  }
};

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_MOMENTUM_RULES_H_
