// Row update rules of the sparse optimizers that report a bitwise delta.
//
// Each rule is a CPU functor that updates ONE embedding row (and its slot
// rows) for ONE occurrence of an index. The arithmetic of every rule is
// written so that, compiled with TensorFlow's own Eigen headers and the same
// vector ISA as the TensorFlow binary (AVX, no FMA), it produces the same bits
// as the stock kernel it mirrors:
//
//   SGD      ResourceScatterAdd(var, indices, (-grad) * lr), the sparse path
//            of tf.compat.v1.train.GradientDescentOptimizer.
//   Adagrad  ResourceSparseApplyAdagrad (update_slots=True).
//   FTRL     ResourceSparseApplyFtrl / ResourceSparseApplyFtrlV2.
//   LazyAdam gather / cwise math / scatter of stock ops, see LazyAdamRule.
//
// The rules with a momentum slot (Momentum, RMSProp) are in momentum_rules.h.
//
// The stock kernels evaluate rows of width > 1 with Eigen expressions over
// `chip<0>` of the row-major [rows, dim] map, and rows of width 1 with scalar
// code, and the two paths do not round alike (Adagrad's vectorized `rsqrt` is
// an approximation refined by one Newton step, FTRL's scalar path uses `pow`
// where the vector path uses `sqrt`). The rules therefore keep both paths and
// the same expression shapes; reordering any operation below breaks
// bit-identity with TensorFlow.

#ifndef TF_ECREC_OPS_CC_KERNELS_OPTIMIZER_RULES_H_
#define TF_ECREC_OPS_CC_KERNELS_OPTIMIZER_RULES_H_

#include <algorithm>
#include <vector>

#include "ops/cc/kernels/op_inputs.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/tensor_types.h"
#include "tensorflow/core/lib/core/errors.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tensorflow {
namespace ec_rec {

using Rows = TTypes<float>::Matrix;            // [rows, dim] view of a variable
using ConstRows = TTypes<float>::ConstMatrix;  // [n, dim] view of the gradient

// The float scalar hyperparameter at `input`.
inline Status ReadScalar(OpKernelContext* ctx, int input, const char* name,
                         float* value) {
  return ScalarInput<float>(ctx, input, name, value);
}

// The hyperparameters of a rule whose only one is the learning rate, the
// float scalar at input kLrInput.
template <int kLrInput>
struct LearningRateOnly {
  struct Hyper {
    float lr;
  };

  Status Read(OpKernelContext* ctx, Hyper* h) const {
    return ReadScalar(ctx, kLrInput, "lr", &h->lr);
  }
};

// var[row] += (-grad[i]) * lr.
//
// GradientDescentOptimizer computes the update with a Mul op and adds it with
// ResourceScatterAdd; negation and IEEE multiplication commute exactly, so the
// fused form here has the same bits.
struct SgdRule : LearningRateOnly<1> {
  static constexpr int kNumSlots = 0;
  static constexpr int kGradInput = 2;
  static constexpr int kIndicesInput = 3;
  static constexpr int kCyclesPerElement = 2;
  static std::vector<const char*> VariableNames() { return {"var"}; }

  explicit SgdRule(OpKernelConstruction*) {}

  void ApplyRow(const Hyper& h, const std::vector<Rows>& tables, int64_t row,
                const ConstRows& grads, int64_t i) const {
    Rows var_rows = tables[0];
    ConstRows grad_rows = grads;
    auto var = var_rows.chip<0>(row);
    auto grad = grad_rows.chip<0>(i);
    var += -grad * grad.constant(h.lr);
  }
};

// accum[row] += grad^2; var[row] -= lr * grad * rsqrt(accum[row]).
//
// Width 1 follows the stock scalar path instead: var -= lr * g / sqrt(accum).
struct AdagradRule : LearningRateOnly<2> {
  static constexpr int kNumSlots = 1;
  static constexpr int kGradInput = 3;
  static constexpr int kIndicesInput = 4;
  static constexpr int kCyclesPerElement = 8;
  static std::vector<const char*> VariableNames() { return {"var", "accum"}; }

  explicit AdagradRule(OpKernelConstruction*) {}

  void ApplyRow(const Hyper& h, const std::vector<Rows>& tables, int64_t row,
                const ConstRows& grads, int64_t i) const {
    Rows var_rows = tables[0];
    Rows accum_rows = tables[1];
    ConstRows grad_rows = grads;
    if (var_rows.dimension(1) == 1) {
      float& accum = accum_rows(row, 0);
      const float g = grad_rows(i, 0);
      accum += g * g;
      var_rows(row, 0) -= h.lr * g / Eigen::numext::sqrt(accum);
      return;
    }
    auto var = var_rows.chip<0>(row);
    auto accum = accum_rows.chip<0>(row);
    auto grad = grad_rows.chip<0>(i);
    accum += grad.square();
    var -= grad.constant(h.lr) * grad * accum.rsqrt();
  }
};

// "Lazy" Adam: only the touched rows of m and v decay.
//
// There is no stock sparse Adam kernel (v1 AdamOptimizer decays every row of
// m and v each step, which is not a sparse update). This rule is the update of
// tf.contrib.opt.LazyAdamOptimizer / tfa.optimizers.LazyAdam, bit-identical to
// the stock-op composite
//
//   m_new = beta1 * gather(m) + (1 - beta1) * grad
//   v_new = beta2 * gather(v) + (1 - beta2) * square(grad)
//   var   = scatter_sub(var, lr * m_new / (sqrt(v_new) + epsilon))
//
// with lr the bias-corrected rate lr0 * sqrt(1 - beta2^t) / (1 - beta1^t),
// computed by the caller. Every operation is a correctly rounded IEEE
// operation, so any evaluation order-preserving form gives the same bits.
struct LazyAdamRule {
  static constexpr int kNumSlots = 2;
  static constexpr int kGradInput = 7;
  static constexpr int kIndicesInput = 8;
  static constexpr int kCyclesPerElement = 12;
  static std::vector<const char*> VariableNames() { return {"var", "m", "v"}; }

  struct Hyper {
    float lr, beta1, beta2, epsilon;
  };

  explicit LazyAdamRule(OpKernelConstruction*) {}

  Status Read(OpKernelContext* ctx, Hyper* h) const {
    TF_RETURN_IF_ERROR(ReadScalar(ctx, 3, "lr", &h->lr));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, 4, "beta1", &h->beta1));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, 5, "beta2", &h->beta2));
    return ReadScalar(ctx, 6, "epsilon", &h->epsilon);
  }

  void ApplyRow(const Hyper& h, const std::vector<Rows>& tables, int64_t row,
                const ConstRows& grads, int64_t i) const {
    Rows var_rows = tables[0];
    Rows m_rows = tables[1];
    Rows v_rows = tables[2];
    ConstRows grad_rows = grads;
    auto var = var_rows.chip<0>(row);
    auto m = m_rows.chip<0>(row);
    auto v = v_rows.chip<0>(row);
    auto grad = grad_rows.chip<0>(i);
    const float one_minus_beta1 = 1.0f - h.beta1;
    const float one_minus_beta2 = 1.0f - h.beta2;
    m = m * m.constant(h.beta1) + grad * grad.constant(one_minus_beta1);
    v = v * v.constant(h.beta2) + grad.square() * grad.constant(one_minus_beta2);
    var -= (m * m.constant(h.lr)) / (v.sqrt() + v.constant(h.epsilon));
  }
};

// FTRL-Proximal, as ResourceSparseApplyFtrl (kShrinkage = false) and
// ResourceSparseApplyFtrlV2 (kShrinkage = true), with the stock kernel's
// `multiply_linear_by_lr` attribute.
template <bool kShrinkage>
struct FtrlRule {
  static constexpr int kNumSlots = 2;
  static constexpr int kGradInput = 3;
  static constexpr int kIndicesInput = 4;
  static constexpr int kCyclesPerElement = 30;
  static std::vector<const char*> VariableNames() {
    return {"var", "accum", "linear"};
  }

  struct Hyper {
    float lr, l1, l2, l2_shrinkage, lr_power;
  };

  explicit FtrlRule(OpKernelConstruction* ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("multiply_linear_by_lr",
                                     &multiply_linear_by_lr_));
  }

  Status Read(OpKernelContext* ctx, Hyper* h) const {
    TF_RETURN_IF_ERROR(ReadScalar(ctx, 5, "lr", &h->lr));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, 6, "l1", &h->l1));
    TF_RETURN_IF_ERROR(ReadScalar(ctx, 7, "l2", &h->l2));
    h->l2_shrinkage = 0.0f;
    if (kShrinkage) {
      TF_RETURN_IF_ERROR(ReadScalar(ctx, 8, "l2_shrinkage", &h->l2_shrinkage));
    }
    TF_RETURN_IF_ERROR(
        ReadScalar(ctx, kShrinkage ? 9 : 8, "lr_power", &h->lr_power));
    // NaN fails these comparisons too, as in the stock kernel.
    if (!(h->lr > 0.0f)) {
      return errors::InvalidArgument("`lr` must be positive, got ", h->lr);
    }
    if (!(h->l1 >= 0.0f) || !(h->l2 >= 0.0f) || !(h->l2_shrinkage >= 0.0f)) {
      return errors::InvalidArgument(
          "`l1`, `l2` and `l2_shrinkage` must be non-negative, got ", h->l1,
          ", ", h->l2, ", ", h->l2_shrinkage);
    }
    if (!(h->lr_power <= 0.0f)) {
      return errors::InvalidArgument("`lr_power` must be non-positive, got ",
                                     h->lr_power);
    }
    return OkStatus();
  }

  void ApplyRow(const Hyper& h, const std::vector<Rows>& tables, int64_t row,
                const ConstRows& grads, int64_t i) const {
    Rows var_rows = tables[0];
    Rows accum_rows = tables[1];
    Rows linear_rows = tables[2];
    ConstRows grad_rows = grads;
    if (var_rows.dimension(1) == 1) {
      ApplyScalar(h, &var_rows(row, 0), &accum_rows(row, 0),
                  &linear_rows(row, 0), grad_rows(i, 0));
      return;
    }
    auto var = var_rows.chip<0>(row);
    auto accum = accum_rows.chip<0>(row);
    auto linear = linear_rows.chip<0>(row);
    auto grad = grad_rows.chip<0>(i);
    if (kShrinkage) {
      ApplyVector(h, var, accum, linear, grad,
                  grad + (2.0f * h.l2_shrinkage) * var);
    } else {
      ApplyVector(h, var, accum, linear, grad, grad);
    }
  }

 private:
  // Width > 1. `shrunk` is the gradient with the l2 shrinkage term (or the
  // gradient itself); it reads `var`, so `linear` is updated before `var`.
  template <typename Var, typename Accum, typename Linear, typename Grad,
            typename Shrunk>
  void ApplyVector(const Hyper& h, Var var, Accum accum, Linear linear,
                   Grad grad, Shrunk shrunk) const {
    const bool sqrt_power = h.lr_power == -0.5f;
    auto new_accum = accum + grad.square();
    if (multiply_linear_by_lr_) {
      if (sqrt_power) {
        linear += shrunk * h.lr - (new_accum.sqrt() - accum.sqrt()) * var;
      } else {
        linear += shrunk * h.lr - (new_accum.pow(-h.lr_power) -
                                   accum.pow(-h.lr_power)) * var;
      }
      const float l1_lr = h.l1 * h.lr;
      auto x = linear.cwiseMin(l1_lr).cwiseMax(-h.l1 * h.lr) - linear;
      const float l2_term = 2.0f * h.l2 * h.lr;
      if (sqrt_power) {
        var = x / (new_accum.sqrt() + linear.constant(l2_term));
      } else {
        var = x / (new_accum.pow(-h.lr_power) + linear.constant(l2_term));
      }
    } else {
      if (sqrt_power) {
        linear += shrunk - (new_accum.sqrt() - accum.sqrt()) / h.lr * var;
      } else {
        linear += shrunk - (new_accum.pow(-h.lr_power) -
                            accum.pow(-h.lr_power)) / h.lr * var;
      }
      auto x = linear.cwiseMin(h.l1).cwiseMax(-h.l1) - linear;
      const float l2_term = 2.0f * h.l2;
      if (sqrt_power) {
        var = x / (new_accum.sqrt() / new_accum.constant(h.lr) +
                   linear.constant(l2_term));
      } else {
        var = x / (new_accum.pow(-h.lr_power) / new_accum.constant(h.lr) +
                   linear.constant(l2_term));
      }
    }
    accum += grad.square();
  }

  // Width 1: the stock scalar path, which uses pow() for the accumulator
  // difference even when lr_power == -0.5.
  void ApplyScalar(const Hyper& h, float* var, float* accum, float* linear,
                   float grad) const {
    const float g =
        kShrinkage ? grad + (2.0f * h.l2_shrinkage * *var) : grad;
    const float new_accum = *accum + grad * grad;
    float sigma = Eigen::numext::pow(new_accum, -h.lr_power) -
                  Eigen::numext::pow(*accum, -h.lr_power);
    if (!multiply_linear_by_lr_) sigma /= h.lr;
    const float new_linear = multiply_linear_by_lr_
                                 ? *linear + g * h.lr - sigma * *var
                                 : *linear + g - sigma * *var;
    const float root = h.lr_power == -0.5f
                           ? Eigen::numext::sqrt(new_accum)
                           : Eigen::numext::pow(new_accum, -h.lr_power);
    float quadratic, l1;
    if (multiply_linear_by_lr_) {
      quadratic = root + 2.0f * h.l2 * h.lr;
      l1 = h.l1 * h.lr;
    } else {
      quadratic = root / h.lr + 2.0f * h.l2;
      l1 = h.l1;
    }
    const float clipped = std::max(std::min(new_linear, l1), -l1);
    *var = (clipped - new_linear) / quadratic;
    *accum = new_accum;
    *linear = new_linear;
  }

  bool multiply_linear_by_lr_ = false;
};

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_OPTIMIZER_RULES_H_
