// EcRecDeltaLog: a per-process record of the in-place updates the logged ops
// made, kept in the device's ResourceMgr so that it outlives sessions.
//
// Every logged op (EcRec>SparseApply*WithDeltaLogged, EcRec>ParityUpdateLogged,
// EcRec>AssignAddLogged) appends exactly one Entry, in the same kernel and
// while it still holds the exclusive locks of the variables it updated, so an
// entry exists if and only if its update happened (a failing op appends
// nothing and writes nothing). An entry records what was XORed into the
// target's words:
//
//   sid     step id, chosen by the caller (unique per training step);
//   target  id of the updated variable group (var + slots, a parity or a
//           replica variable, a counter), chosen by the caller (>= 0);
//   source  for folds, the target id the delta came from; -1 otherwise;
//   rows    the rows written, as the op got them (they may repeat);
//   delta   int32 [rows, width] and coef: row i of the target had
//           coef * delta[i] XORed into it (GF(2^field_bits) symbol by
//           symbol; coef 1 is plain XOR);
//   seq     append sequence number, unique and increasing within the log.
//
// To keep appends cheap, `delta` is not copied: it is the apply op's own
// output, or the fold's input, shared by reference (TensorFlow never writes
// a buffer that has a second reference), and the coef product and the
// per-row merge happen only when an entry is read or undone (Materialize):
// then it is the DISTINCT rows, ascending, each with the XOR of everything
// folded into it, i.e. bits(old) ^ bits(new) of that row.
//
// Entries of one target are appended in the order their updates happened
// (the append is under the target's lock), so XORing their deltas back in
// reverse seq order undoes them. Lock order: variable locks, then the log's
// mutex; nothing takes a variable lock while holding the log's mutex.
//
// Entries have a kind: kApply (an optimizer's update of a variable and its
// slots, by a SparseApply*WithDeltaLogged op), kFold (a ParityUpdateLogged
// fold of such an update into a parity or replica; `source` names the apply
// target and `source_seq` the apply entry's seq in the data PS's log) and
// kCounter (AssignAddLogged).
//
// A step commits in two rounds (the protocol is in tf_ecrec/step/steplog.py).
// Round 1, CommitInOrder, runs on every data PS once all the step's updates
// are done: it waits until no kApply entry of another step not yet committed
// by its own round 1 precedes one of the step's on the same target, then marks
// the step's kApply entries in_order_committed (they stay in the log, so that
// a step whose round 1 ran on some PS tasks but not on a lost one can still be
// undone whole) and remembers the sid in the data-committed ring. Round 2, Commit, runs on
// every PS after round 1 everywhere: it drops the step's remaining entries
// and remembers the sid in the committed ring (the last kCommittedCapacity
// commits). A kFold entry dropped by Commit or Drop raises the source's
// "settled source seq" to its source_seq: every apply of that source up to
// it is then folded here for good.
//
// Generations: the top bits of a sid (bits 48..61) are the generation of
// the cluster view the step's graph was built for. SetGeneration raises the
// log's minimum; a write or commit of an older generation is refused
// (Aborted), so a trainer still talking to a PS that has moved cannot change
// this PS. Fencing a sid makes every later
// logged op of it fail (Aborted, nothing written) and waits for those already
// writing: after Fence returns, the sid's entries are final, whatever
// stragglers of a dead worker's step still run. Committed sids are refused
// the same way. Ops with `bypass_fence` (recovery's own) are let through. Entries that leave the log while
// their update stays in effect (by Commit or Drop) are "settled"; for each
// target the log keeps the highest settled seq, so that an undo can refuse
// to XOR an entry back under a later update it no longer knows.

#ifndef TF_ECREC_OPS_CC_KERNELS_DELTA_LOG_H_
#define TF_ECREC_OPS_CC_KERNELS_DELTA_LOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/core/refcount.h"
#include "tensorflow/core/platform/mutex.h"
#include "ops/cc/kernels/recovery_view.h"

namespace tensorflow {
namespace ec_rec {

class DeltaLog : public ResourceBase {
 public:
  static constexpr int64_t kCommittedCapacity = 65536;

  static constexpr int kGenerationShift = 48;
  static int64_t GenerationOf(int64_t sid) { return sid >> kGenerationShift; }

  enum Kind : int32_t { kApply = 0, kFold = 1, kCounter = 2 };

  struct Entry {
    int64_t seq = -1;
    int64_t sid = 0;
    int32_t target = 0;
    int32_t source = -1;
    int64_t source_seq = -1;
    Kind kind = kApply;
    // A kApply entry that its step's round 1 committed here: it no longer
    // holds back other steps' round 1, and stays (undoable, if it is still
    // the newest of its target) until round 2 drops it.
    bool in_order_committed = false;
    // Batched folds (delta_log_batch.cc): a kApply entry whose fold a round
    // found on every fold target.
    bool folded = false;
    int64_t micros = 0;  // when it was appended
    std::vector<int64_t> rows;  // as given; may repeat
    Tensor delta;               // int32 [rows.size(), width]; never written
    uint32_t coef = 1;
    int field_bits = 16;
    int64_t width() const { return delta.dim_size(1); }
  };

  // An entry's net effect: distinct rows, ascending, and the [rows, width]
  // words XORed into each.
  struct Words {
    std::vector<int64_t> rows;
    std::vector<int32_t> words;
    int64_t width = 0;
  };
  static Words Materialize(const Entry& entry);

  // What a logged op appends: the caller's ids, read and checked up front.
  struct Tag {
    int64_t sid = 0;
    int32_t target = 0;
    int32_t source = -1;
    int64_t source_seq = -1;
  };

  // A pending CommitInOrder.
  struct Waiter {
    int64_t id = 0;
    std::vector<int64_t> sids;
    bool bypass = false;
    std::function<void(const Status&)> done;
  };

  // Seqs start at the creation time in microseconds times 1024, so that the
  // log of a restarted PS numbers its entries above every seq its previous
  // incarnation handed out (other logs remember those seqs as committed
  // folds' source seqs).
  DeltaLog();
  ~DeltaLog() override;

  std::string DebugString() const override;
  int64_t MemoryUsed() const override;

  // Admits a write of `sid`: Aborted if the sid is fenced or committed
  // (unless `bypass`), else counts it in flight until EndWrite.
  Status BeginWrite(int64_t sid, bool bypass);
  void EndWrite(int64_t sid);

  // Appends `entry` (its seq is assigned here) and returns the seq.
  int64_t Append(Entry entry);

  // Refuses every later write of `sids` (see BeginWrite), then waits until
  // none of them is in flight. Commit lifts the fence of its sids (they stay
  // refused as committed).
  void Fence(const std::vector<int64_t>& sids);

  // Drops the entries of `sids` and remembers the sids as committed. Without
  // `bypass`, refuses (Aborted, nothing changes) if one of them is fenced or
  // of an older generation.
  Status Commit(const std::vector<int64_t>& sids, bool bypass = true);

  // Round 1 of a step's commit: once no kApply entry of a sid outside `sids`
  // (and not round-1 committed itself) precedes a kApply entry of `sids` on
  // the same target, marks the kApply entries of `sids` in_order_committed and
  // remembers the sids as data-committed, then calls
  // `done` (outside the log's mutex). Fails with Aborted if, meanwhile, a
  // sid is fenced (unless `bypass`), or after `timeout_ms`.  Returns the
  // wait's id for `Withdraw`, or -1 if `done` was called already.
  int64_t CommitInOrder(std::vector<int64_t> sids, bool bypass,
                        int64_t timeout_ms,
                        std::function<void(const Status&)> done);

  // Ends the waiting CommitInOrder `id` with `status` (no-op if it ended).
  void Withdraw(int64_t id, const Status& status);

  // Raises the minimum generation of the sids this log admits.
  void SetGeneration(int64_t generation);

  // The rows of `target` folded from `source` under `sid`; `*settled` is
  // true if `sid` was already committed here (nothing of it may be written).
  void FoldedRows(int64_t sid, int32_t target, int32_t source,
                  std::unordered_set<int64_t>* rows, bool* settled) const;

  // Whether `sid` has an entry of `target`, or was committed here.
  bool HasEntryOrCommitted(int64_t sid, int32_t target) const;

  // The seq of the entry (sid, target), -1 if none.
  int64_t SeqOf(int64_t sid, int32_t target) const;

  // ---- Batched folds (delta_log_batch.cc; the protocol: docs/settlement.md,
  // "Folds batched over steps").
  // Copies of the kApply entries of `target` not marked folded, in seq order
  // (rounds may overlap: a fold target skips what it holds, HasFold).
  std::vector<Entry> Take(int32_t target) const;
  // The rows of the kFold entries of (target, source) in the log, by sid.
  std::unordered_map<int64_t, std::unordered_set<int64_t>> FoldedRowsBySid(
      int32_t target, int32_t source) const;
  // Marks the kApply entries `seqs` folded (written on every fold target).
  void MarkFolded(const std::vector<int64_t>& seqs);
  // The sids of `candidates` whose every kApply entry here is folded (or
  // round-1 committed), as is every earlier kApply entry of the same target;
  // a candidate with no entry here is ready; a fenced one is not.
  std::vector<int64_t> Ready(const std::vector<int64_t>& candidates) const;
  // Round 2 of each of `sids` that is not fenced or of an older generation
  // (those are left to settlement); returns the sids committed here now or
  // before.
  std::vector<int64_t> CommitEach(const std::vector<int64_t>& sids);
  // The sids with a kCounter entry of `target` in the log.
  std::vector<int64_t> Counted(int32_t target) const;
  // Aborted if `id` (a step or fold round id) is of an older generation than
  // the log admits.
  Status Admits(int64_t id) const;
  // Whether `sid` is committed here (the last kCommittedCapacity commits).
  bool IsCommitted(int64_t sid) const;

  // Writes the outputs of EcRec>DeltaLogPending.
  Status Pending(OpKernelContext* ctx) const;

  // Drops the entries of `sids` (their updates stay in effect).
  void Drop(const std::vector<int64_t>& sids);

  // Writes the snapshot outputs of EcRec>DeltaLogRead.
  Status Read(OpKernelContext* ctx);

  // Removes the entry `seq` after `apply` succeeded on its materialized
  // words, under the log's mutex. `*found` is false (and nothing is called)
  // if the log holds no such entry. With `ordered`, fails with
  // FailedPrecondition (calling nothing) if the entry's target has a later
  // entry in the log or a later settled one. `apply` must not touch the log.
  Status Undo(int64_t seq, int32_t target, bool ordered,
              const std::function<Status(const Words&)>& apply, bool* found);
  // Lets waiting CommitInOrders re-check after an undo (call without locks).
  void WakeAfterUndo();

  // What this process keeps while a lost PS is rebuilt with training going
  // on (recovery_view.h); thread-safe on its own.
  RecoveryView& view() { return view_; }

 private:
  // Removes the entries `settles` picks, their updates staying in effect:
  // records the highest settled seq per target (and per fold source).
  void RemoveSettledLocked(const std::function<bool(const Entry&)>& settles)
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RemoveSettledLocked of every entry of `sids`.
  void RemoveSidsLocked(const std::vector<int64_t>& sids)
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a sid of `sids` is fenced or of an older generation.
  Status RefusedLocked(const std::vector<int64_t>& sids) const
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits what of `w` may commit now (*progress if anything); *ready when
  // all of it is committed; an error when it must fail.
  Status TryInOrderLocked(const Waiter& w, bool* ready, bool* progress)
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits the waiters that may now; moves their callbacks to `*done`.
  void WakeWaitersLocked(
      std::vector<std::pair<std::function<void(const Status&)>, Status>>* done)
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimeOut(int64_t waiter_id);
  static void Finish(
      std::vector<std::pair<std::function<void(const Status&)>, Status>>* done);
  void Remember(std::deque<int64_t>* ring, std::unordered_set<int64_t>* set,
                int64_t sid) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable mutex mu_;
  int64_t next_seq_ TF_GUARDED_BY(mu_) = 0;
  int64_t bytes_ TF_GUARDED_BY(mu_) = 0;
  std::deque<Entry> entries_ TF_GUARDED_BY(mu_);
  std::deque<int64_t> committed_ TF_GUARDED_BY(mu_);
  std::unordered_set<int64_t> committed_set_ TF_GUARDED_BY(mu_);
  std::deque<int64_t> data_committed_ TF_GUARDED_BY(mu_);
  std::unordered_set<int64_t> data_committed_set_ TF_GUARDED_BY(mu_);
  std::map<int32_t, int64_t> settled_ TF_GUARDED_BY(mu_);
  std::map<int32_t, int64_t> settled_source_ TF_GUARDED_BY(mu_);
  int64_t min_generation_ TF_GUARDED_BY(mu_) = 0;
  int64_t next_waiter_ TF_GUARDED_BY(mu_) = 0;
  std::vector<Waiter> waiters_ TF_GUARDED_BY(mu_);
  std::unordered_set<int64_t> fenced_ TF_GUARDED_BY(mu_);
  std::map<int64_t, int> in_flight_ TF_GUARDED_BY(mu_);
  condition_variable writes_done_;
  RecoveryView view_;
};

// Holds a write admitted by DeltaLog::BeginWrite until destruction.
class LogWrite {
 public:
  LogWrite() = default;
  LogWrite(const LogWrite&) = delete;
  LogWrite& operator=(const LogWrite&) = delete;
  ~LogWrite() {
    if (log_ != nullptr) log_->EndWrite(sid_);
  }
  bool active() const { return log_ != nullptr; }
  Status Begin(DeltaLog* log, int64_t sid, bool bypass) {
    TF_RETURN_IF_ERROR(log->BeginWrite(sid, bypass));
    log_ = log;
    sid_ = sid;
    return OkStatus();
  }

 private:
  DeltaLog* log_ = nullptr;
  int64_t sid_ = 0;
};

}  // namespace ec_rec
}  // namespace tensorflow

#endif  // TF_ECREC_OPS_CC_KERNELS_DELTA_LOG_H_
