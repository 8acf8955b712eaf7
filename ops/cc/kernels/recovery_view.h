// RecoveryView: what a PS process keeps while a lost PS is rebuilt with
// training going on (tf_ecrec/rebuild/, docs/rebuild.md). Every DeltaLog
// holds one (`DeltaLog::view()`), so every logged op reaches it.
//
// The rebuild decodes the lost rows from the state the survivors had at T0,
// the moment recovery settled every step and before any trainer resumed:
//
// * On the survivors, rows in *preserved* ranges (the chunks of stripes that
//   lost a member) keep their T0 words: the first write after T0 to such a
//   row saves the row's words before it changes them (`Preserve`, called by
//   every logged writer under the variables' locks), and decoding reads the
//   saved words where there are some (`Substitute`). Memory: one saved row
//   per distinct row written during the rebuild.
// * The rebuilt PS keep T0 too, row by row from each row's install (which
//   gives the row its T0 words): a rebuild resumed for the lost PS that did
//   not finish decodes from those that did, and must read their T0 words.
// * On the rebuilt PS, rows of its lost variables are *pending* until the
//   rebuild installs them. A lookup of pending rows waits (`Await`, for an
//   asynchronous kernel: no thread is held) and asks for them (`Wanted`), so
//   the coordinator decodes those first; an update of a pending row is
//   refused (`CheckWritable`), so nothing trains on a row before its value
//   is there. Installing a row writes it at most once (`Claim`, then
//   `Installed`, both under the variables' locks): a data row gets its T0
//   value, which no update can have changed while it was pending; a parity
//   row gets the code of the T0 data XORed into the folds that reached it
//   since T0, which is the code of the data now.
//
// Keys are the resource names of the first variable of a group (a data
// variable with its slots, or a parity variable), so the lookup, the
// optimizer's ops and the rebuild's ops, built independently, meet.
//
// Lock order: variable locks, then the view's mutex (never the reverse).
// Callbacks (waiters' done) run outside the mutex.

#ifndef TF_ECREC_OPS_CC_KERNELS_RECOVERY_VIEW_H_
#define TF_ECREC_OPS_CC_KERNELS_RECOVERY_VIEW_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ops/cc/kernels/word_table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/mutex.h"

namespace tensorflow {
namespace ec_rec {

class RecoveryView {
 public:
  using Done = std::function<void(const Status&)>;

  RecoveryView() = default;
  RecoveryView(const RecoveryView&) = delete;
  RecoveryView& operator=(const RecoveryView&) = delete;

  // Whether anything is pending or preserved (a cheap check for writers).
  bool active() const { return any_pending_ || any_preserved_; }

  // ---- the rebuilt PS ----------------------------------------------------

  // Every row of `key` in [0, rows) becomes pending (again).
  void BeginPending(const std::string& key, int64_t rows);
  // Forgets every pending row of this PS (a new T0 supersedes whatever an
  // earlier, unfinished rebuild left, under keys of variables re-created
  // since); its waiters fail with Aborted.
  void ForgetPending();
  // Pending rows of this process, in all.
  int64_t PendingRows() const;
  // FailedPrecondition naming the first pending row of `rows`, if any.
  Status CheckWritable(const std::string& key, const int64_t* rows,
                       int64_t n) const;
  // Calls `done` once no row of `rows` is pending: at once, or after the
  // installs; returns an id for Cancel (-1 if done was called already).
  int64_t Await(const std::string& key, std::vector<int64_t> rows, Done done);
  // Fails the waiter `id` with Cancelled (no-op if it finished).
  void Cancel(int64_t id);
  // The pending rows of `key` in [lo, hi) that waiters ask for, ascending.
  std::vector<int64_t> Wanted(const std::string& key, int64_t lo,
                              int64_t hi) const;
  // Calls `done` once some waiter asks for a row; returns an id for
  // WantedTimeOut (-1 if done was called already).
  int64_t WaitWanted(std::function<void()> done);
  // Calls the WaitWanted callback `id` now if it has not run.
  void WantedTimeOut(int64_t id);
  // Which of `rows` are pending (`*pending` is cleared and filled). The
  // caller holds the variables' locks, writes the pending ones, then calls
  // Installed with the same rows and mask.
  void Claim(const std::string& key, const std::vector<int64_t>& rows,
             std::vector<bool>* pending) const;
  void Installed(const std::string& key, const std::vector<int64_t>& rows,
                 const std::vector<bool>& pending);
  // A row installed on a PS being rebuilt gets its T0 words: where the row
  // has a saved copy (a fold reached a pending parity row: its zeros were
  // saved), the installed words go into the copy too (XORed in with `add`,
  // written without), so that the copy holds the row's T0 words. Call under
  // the variables' locks with Claim's mask, before Installed.
  void InstallSaved(const std::string& key, const std::vector<int64_t>& rows,
                    const std::vector<bool>& pending, const int32_t* words,
                    int64_t width, bool add);

  // ---- the survivors -----------------------------------------------------

  // Rows [lo, hi) of each range of `key` keep their T0 words from now on;
  // replaces the key's ranges and forgets its saved rows.
  void BeginPreserve(const std::string& key,
                     std::vector<std::pair<int64_t, int64_t>> ranges);
  // Forgets every preserved range and saved row.
  void EndPreserve();
  // Saves the words of each of `rows` (as `tables` hold them now) that is in
  // a preserved range of `key` and not saved yet. Call under the tables'
  // locks, before writing the rows.
  void Preserve(const std::string& key, const std::vector<WordTable>& tables,
                const int64_t* rows, int64_t n);
  // Overwrites row i of `words` ([n, width]) with the saved words of rows[i]
  // where `key` has some.
  // InvalidArgument if a saved row has another width.
  Status Substitute(const std::string& key, const int64_t* rows, int64_t n,
                    int64_t width, int32_t* words) const;
  // Rows saved, in all.
  int64_t SavedRows() const;
  // Variable groups with preserved ranges (a rebuild under way, or one whose
  // end was never called).
  int64_t PreservedGroups() const;

 private:
  struct Pending {
    std::vector<bool> rows;  // true: pending
    int64_t count = 0;
  };
  struct Waiter {
    int64_t id = 0;
    std::string key;
    std::unordered_set<int64_t> rows;  // still pending
    Done done;
  };
  struct Preserved {
    std::vector<std::pair<int64_t, int64_t>> ranges;  // sorted, disjoint
    std::unordered_map<int64_t, std::vector<int32_t>> saved;
    bool Covers(int64_t row) const;
  };

  static void Finish(std::vector<std::pair<Done, Status>>* done);
  void NotifyWantedLocked(std::vector<std::function<void()>>* wake)
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable mutex mu_;
  std::atomic<bool> any_pending_{false};
  std::atomic<bool> any_preserved_{false};
  std::map<std::string, Pending> pending_ TF_GUARDED_BY(mu_);
  std::map<int64_t, Waiter> waiters_ TF_GUARDED_BY(mu_);
  int64_t next_waiter_ TF_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<int64_t, std::function<void()>>> wanted_waiters_
      TF_GUARDED_BY(mu_);
  int64_t next_wanted_waiter_ TF_GUARDED_BY(mu_) = 0;
  std::map<std::string, Preserved> preserved_ TF_GUARDED_BY(mu_);
  int64_t saved_rows_ TF_GUARDED_BY(mu_) = 0;
};

// The resource name of the variable handle at `input` (a RecoveryView key).
Status VariableKey(OpKernelContext* ctx, int input, std::string* key);

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_RECOVERY_VIEW_H_
