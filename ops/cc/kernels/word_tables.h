// Resource variables seen as matrices of 32-bit words, locked for an op.

#ifndef TF_ECREC_OPS_CC_KERNELS_WORD_TABLES_H_
#define TF_ECREC_OPS_CC_KERNELS_WORD_TABLES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ops/cc/kernels/locked_variables.h"
#include "ops/cc/kernels/op_inputs.h"
#include "ops/cc/kernels/word_table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/strings/strcat.h"

namespace tensorflow {
namespace ec_rec {

// The locked variables of inputs [first, first + n) as word tables of equal
// row count; `*width` is the sum of their row widths.
inline Status LockWordTables(OpKernelContext* ctx, int first, int n,
                             LockedVariables* vars,
                             std::vector<WordTable>* tables, int64_t* width) {
  std::vector<std::string> labels(n);
  std::vector<const char*> names(n);
  std::vector<int> inputs(n);
  for (int i = 0; i < n; ++i) {
    labels[i] = n == 1 ? std::string("var") : strings::StrCat("vars[", i, "]");
    names[i] = labels[i].c_str();
    inputs[i] = first + i;
  }
  TF_RETURN_IF_ERROR(vars->AcquireWords(ctx, inputs, names));
  *width = 0;
  for (int i = 0; i < n; ++i) {
    tables->push_back(WordsOf(vars->tensor(i)));
    const WordTable& table = tables->back();
    if (table.rows != tables->front().rows) {
      return errors::InvalidArgument(
          "`", names[i], "` has ", table.rows, " rows but `", names[0],
          "` has ", tables->front().rows, "; they must be equal");
    }
    *width += table.words;
  }
  return OkStatus();
}

// A kernel of an op whose variables are the input list `vars: N * resource`.
class VarsOpKernel : public OpKernel {
 public:
  explicit VarsOpKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    EC_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
  }

 protected:
  int n_ = 1;  // N
};

// The variables of an op taking `vars: N * resource`, locked as word tables
// (LockWordTables) until destruction.
struct LockedWordTables {
  LockedVariables vars;
  std::vector<WordTable> tables;
  int64_t width = 0;  // words of a row, all tables side by side

  Status Lock(OpKernelContext* ctx, int first, int n) {
    return LockWordTables(ctx, first, n, &vars, &tables, &width);
  }
  int64_t rows() const { return tables.front().rows; }

  // Checks that rows of the input `name` have `words` words, as the tables'.
  Status CheckWidth(const char* name, int64_t words) const {
    if (words != width) {
      return errors::InvalidArgument(
          "`", name, "` rows have ", words, " words but the variables' rows "
          "have ", width, " together; they must be equal");
    }
    return OkStatus();
  }
};

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_WORD_TABLES_H_
