// Pieces of the shape functions of tf_ecrec's ops (ops/cc/ops/*.cc).

#ifndef TF_ECREC_OPS_CC_OPS_SHAPE_FNS_H_
#define TF_ECREC_OPS_CC_OPS_SHAPE_FNS_H_

#include <initializer_list>
#include <utility>

#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tensorflow {
namespace ec_rec {

// Checks that inputs [first, last) are scalars.
inline Status ScalarInputs(shape_inference::InferenceContext* c, int first,
                           int last) {
  shape_inference::ShapeHandle unused;
  for (int i = first; i < last; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  }
  return OkStatus();
}

// Checks the rank of each (input, rank).
inline Status RanksAre(shape_inference::InferenceContext* c,
                       std::initializer_list<std::pair<int, int>> ranks) {
  shape_inference::ShapeHandle unused;
  for (const auto& [input, rank] : ranks) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(input), rank, &unused));
  }
  return OkStatus();
}

// Output 0 is a matrix of unknown dimensions (rows of words).
inline Status UnknownMatrixOutput(shape_inference::InferenceContext* c) {
  c->set_output(0, c->Matrix(shape_inference::InferenceContext::kUnknownDim,
                             shape_inference::InferenceContext::kUnknownDim));
  return OkStatus();
}

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_OPS_SHAPE_FNS_H_
