// The rows an index vector addresses, checked once, with each row's first
// occurrence marked, and their positions split into shards of whole rows.
// Includers define EIGEN_USE_THREADS (for Eigen::ThreadPoolDevice).

#ifndef TF_ECREC_OPS_CC_KERNELS_ROW_SHARDS_H_
#define TF_ECREC_OPS_CC_KERNELS_ROW_SHARDS_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tensorflow {
namespace ec_rec {

// The positions of one shard, in input order. `positions` is null when the
// shard is all of 0..n-1 (nothing was partitioned).
class RowShard {
 public:
  RowShard(const int64_t* positions, int64_t begin, int64_t end)
      : positions_(positions), begin_(begin), end_(end) {}

  template <typename Visit>
  void ForEach(Visit visit) const {
    if (positions_ == nullptr) {
      for (int64_t i = begin_; i < end_; ++i) visit(i);
    } else {
      for (int64_t k = begin_; k < end_; ++k) visit(positions_[k]);
    }
  }

  // Like ForEach, and calls `ahead(j)` with the position visited kAhead
  // visits later, before the visit: rows are addressed at random, and a
  // prefetch of the later row's lines overlaps its cache misses with the
  // current row's work.
  template <typename Visit, typename Ahead>
  void ForEach(Visit visit, Ahead ahead) const {
    const int64_t last = end_ - kAhead;
    if (positions_ == nullptr) {
      for (int64_t i = begin_; i < end_; ++i) {
        if (i < last) ahead(i + kAhead);
        visit(i);
      }
    } else {
      for (int64_t k = begin_; k < end_; ++k) {
        if (k < last) ahead(positions_[k + kAhead]);
        visit(positions_[k]);
      }
    }
  }

 private:
  static constexpr int64_t kAhead = 8;

  const int64_t* positions_;
  int64_t begin_;
  int64_t end_;
};

// Every position of a row lands in the same shard, and a shard visits its
// positions in input order, so a shard replays a row's occurrences in input
// order and distinct shards touch distinct rows (they may run concurrently).
// Nothing is sorted: an update that fits one thread runs over the positions
// as given, and a larger one is bucketed by a hash of the row in one stable
// pass.
class RowShards {
 public:
  // Reads `indices` (a vector of int32 or int64) once, so that a concurrent
  // writer to its buffer cannot slip an unchecked value past the bounds check.
  template <typename Tindex>
  Status Build(const Tensor& indices, int64_t num_rows, const char* name) {
    const auto flat = indices.flat<Tindex>();
    const int64_t n = flat.size();
    rows_.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = static_cast<int64_t>(flat(i));
      if (row < 0 || row >= num_rows) {
        return errors::InvalidArgument(name, "[", i, "] = ", row,
                                       " is out of range [0, ", num_rows, ")");
      }
      rows_[i] = row;
    }
    num_rows_ = num_rows;
    return OkStatus();
  }

  // Finds the positions that repeat an earlier position's row, with a bitmap
  // of the rows when it is at most 8 bytes per position, else with a hash set
  // of the rows (two slots per position). Only the ops that treat a row's
  // first occurrence apart need it.
  void MarkFirstOccurrences() {
    const int64_t n = size();
    first_.clear();
    if (num_rows_ <= kBitmapRowsPerPosition * n) {
      std::vector<uint64_t> seen((num_rows_ + 63) / 64, 0);
      for (int64_t i = 0; i < n; ++i) {
        uint64_t& word = seen[rows_[i] >> 6];
        const uint64_t bit = uint64_t{1} << (rows_[i] & 63);
        if (word & bit) MarkRepeat(i);
        word |= bit;
      }
      return;
    }
    int shift = 64;
    while ((uint64_t{1} << (64 - shift)) < 2 * static_cast<uint64_t>(n)) --shift;
    const uint64_t mask = (uint64_t{1} << (64 - shift)) - 1;
    std::vector<int64_t> slots(mask + 1, -1);  // rows are >= 0
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = rows_[i];
      uint64_t h = Hash(row) >> shift;
      while (slots[h] != -1 && slots[h] != row) h = (h + 1) & mask;
      if (slots[h] == row) MarkRepeat(i);
      slots[h] = row;
    }
  }

  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  int64_t row(int64_t i) const { return rows_[i]; }
  const int64_t* rows_data() const { return rows_.data(); }
  // Valid after MarkFirstOccurrences.
  bool has_duplicates() const { return !first_.empty(); }
  bool is_first(int64_t i) const { return first_.empty() || first_[i] != 0; }

  // Calls `run(const RowShard&)` for shards that cover every position, on as
  // many threads of `device` as `cost` (of one position) makes worthwhile;
  // in the calling thread, with one shard of all positions, when that is one.
  template <typename Run>
  void ForEachShard(const Eigen::ThreadPoolDevice& device,
                    const Eigen::TensorOpCost& cost, Run run) {
    const int64_t n = size();
    int threads = Eigen::TensorCostModel<Eigen::ThreadPoolDevice>::
        numThreads(static_cast<double>(n), cost, device.numThreads());
    // A floor of work per thread above Eigen's: bucketing the positions and
    // waking pool threads costs more than it saves on an update of a few
    // thousand rows, and a PS shares its cores with the trainers (measured:
    // 1,500 ids of width 16, Adagrad with delta, 240 us on two threads,
    // 154 us on one; benchmarks/parity_ops.py --threads 2).
    const double cycles = Eigen::TensorCostModel<Eigen::ThreadPoolDevice>::
        totalCost(static_cast<double>(n), cost);
    threads = static_cast<int>(std::min<double>(threads, cycles / kMinCyclesPerThread));
    if (threads <= 1) {
      run(RowShard(nullptr, 0, n));
      return;
    }
    // Oversharded like Eigen's parallelFor, to even out uneven shards.
    const int64_t num_shards = 4 * static_cast<int64_t>(threads);
    Partition(num_shards);
    const double share = static_cast<double>(n) / num_shards;
    device.parallelFor(
        num_shards,
        Eigen::TensorOpCost(cost.bytes_loaded() * share,
                            cost.bytes_stored() * share,
                            cost.compute_cycles() * share),
        [&](int64_t begin, int64_t end) {
          for (int64_t s = begin; s < end; ++s) {
            run(RowShard(positions_.data(), starts_[s], starts_[s + 1]));
          }
        });
  }

  // Hints the first cache lines of a row of `words` 32-bit words into the
  // cache; the hardware prefetcher follows the rest of a long row. Inline
  // asm, because GCC takes __builtin_prefetch for free of side effects and
  // deletes the calls of a function that does nothing else (the lambdas
  // passed to RowShard::ForEach as `ahead`).
  static void Prefetch(const void* row, int64_t words) {
    const char* p = static_cast<const char*>(row);
    const int64_t bytes = words * 4;
    for (int64_t b = 0; b < bytes && b < kPrefetchBytes; b += 64) {
      asm volatile("prefetcht0 %0" : : "m"(p[b]));
    }
  }

  // The rows of all positions, in input order (moved out: the shards are
  // unusable afterwards).
  std::vector<int64_t> ReleaseRows() { return std::move(rows_); }

 private:
  static constexpr int64_t kBitmapRowsPerPosition = 64;
  static constexpr double kMinCyclesPerThread = 2e6;
  static constexpr int64_t kPrefetchBytes = 256;

  static uint64_t Hash(int64_t row) {
    return static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull;  // Fibonacci
  }

  void MarkRepeat(int64_t i) {
    if (first_.empty()) first_.assign(rows_.size(), 1);
    first_[i] = 0;
  }

  // A stable counting sort of the positions by shard (the top bits of the
  // row's hash, scaled to the shard count).
  void Partition(int64_t num_shards) {
    const int64_t n = size();
    auto shard_of = [num_shards](int64_t row) {
      return static_cast<int64_t>(
          static_cast<unsigned __int128>(Hash(row)) * num_shards >> 64);
    };
    starts_.assign(num_shards + 1, 0);
    for (int64_t i = 0; i < n; ++i) ++starts_[shard_of(rows_[i]) + 1];
    for (int64_t s = 0; s < num_shards; ++s) starts_[s + 1] += starts_[s];
    std::vector<int64_t> next(starts_.begin(), starts_.end() - 1);
    positions_.resize(n);
    for (int64_t i = 0; i < n; ++i) positions_[next[shard_of(rows_[i])]++] = i;
  }

  std::vector<int64_t> rows_;
  int64_t num_rows_ = 0;
  std::vector<uint8_t> first_;  // empty: every position is a first occurrence
  std::vector<int64_t> positions_;
  std::vector<int64_t> starts_;
};

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_ROW_SHARDS_H_
