"""Throughput of the parity op and of the apply-with-delta op, against NumPy and stock TF.

Measured side by side in one run, on this machine:

* ``parity_update`` (``EcRec>ParityUpdate``) folding ``n`` random delta rows
  into a ``[parity_rows, width]`` int32 parity, with ``coef=1`` (plain XOR)
  and with a GF(2^16) coefficient (``Code(4, 2).coef(1, 1)`` by default);
* NumPy ``np.bitwise_xor(a, b, out=a)`` on two contiguous buffers of the same
  bytes as the delta: the streaming (memory- or cache-bound) limit that the
  ratio column refers to;
* NumPy ``parity[rows] ^= delta``: the same gather/XOR/scatter as the op;
* ``sparse_apply_adagrad_with_delta`` against stock ``ResourceSparseApplyAdagrad``
  on the same ``[parity_rows, width / 2]`` table, accumulator and ids (so the
  ``[n, width]`` delta lines up with the parity rows), and the two chained
  (apply with delta, then fold the delta into parity).

Method.  TF runs in graph mode in one ``tf.compat.v1.Session``; graphs are
built and warmed up before timing.  Rows, deltas, ids and gradients are graph
constants, so nothing is fed or fetched.  To amortize the ``session.run``
overhead, one timed sample runs ``inner`` copies of the op chained by control
dependencies (NumPy: a Python loop of ``inner`` calls), with ``inner`` chosen
so that a sample moves about ``--sample-bytes``; the time per call is the
sample time divided by ``inner``.  Repetitions are interleaved (every
operation and shape once per repetition, in an order rotated each time) so
that drift on a shared machine falls on all of them alike.  Reported: median
seconds per call, GB/s (bytes per call / median; 1 GB = 1e9 bytes), and the
ratio to the NumPy XOR limit of the same bytes as the median over repetitions
of the per-repetition ratio ``t_numpy_xor / t_op`` (higher is better, 1.0 =
streaming speed).  Nothing here asserts on timings.

"Bytes per call" is ``n * width * 4`` for every row: the delta bytes folded
into parity, which for Adagrad is also the bytes of table + accumulator rows
it rewrites.  Row ids are drawn without replacement, so the NumPy fancy
``^=`` means the same as the op (with duplicates it would drop all but one).

    python benchmarks/parity_ops.py                         # defaults, ~30-60 s
    python benchmarks/parity_ops.py --rows 4096,65536 --repeats 31 --threads 2

Keep ``--threads`` at 1 (the default) to compare a single-threaded op with
single-threaded NumPy and to stay light on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from tf_ecrec import ops as ec_ops
from tf_ecrec.erasure import codec

ADAGRAD_LR = np.float32(0.01)

# Operation keys, in table order, with their table labels.
LABELS = {
    "numpy_xor": "NumPy `bitwise_xor(a, b, out=a)` (contiguous)",
    "numpy_fancy": "NumPy `parity[rows] ^= delta`",
    "parity_xor": "`parity_update` coef=1 (XOR)",
    "parity_gf": "`parity_update` coef={coef:#06x} (GF(2^16))",
    "adagrad_stock": "stock `ResourceSparseApplyAdagrad`",
    "adagrad_delta": "`sparse_apply_adagrad_with_delta`",
    "adagrad_delta_fold": "`sparse_apply_adagrad_with_delta` + `parity_update` coef=1",
}
ALL_OPS = tuple(LABELS)


@dataclass
class Case:
    """One (operation, shape): a callable that runs ``inner`` calls, and its timings."""

    op: str
    n: int
    inner: int
    run: Callable[[], None]
    seconds: list[float] = field(default_factory=list)  # per call, one per repetition


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="4096,16384,65536", help="rows per call, comma-separated")
    parser.add_argument("--parity-rows", type=int, default=200_000, help="rows of the parity (and table)")
    parser.add_argument("--width", type=int, default=32, help="int32 words per parity row (even)")
    parser.add_argument("--repeats", type=int, default=21, help="interleaved timed repetitions")
    parser.add_argument("--warmup", type=int, default=2, help="untimed repetitions first")
    parser.add_argument(
        "--sample-bytes", type=float, default=16e6, help="delta bytes per timed sample (sets inner calls)"
    )
    parser.add_argument("--threads", type=int, default=1, help="TF intra-op threads")
    parser.add_argument("--coef", type=lambda s: int(s, 0), default=None, help="GF(2^16) coefficient")
    parser.add_argument("--ops", default=",".join(ALL_OPS), help=f"subset of {','.join(ALL_OPS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-check", action="store_true", help="skip the one-off correctness check")
    args = parser.parse_args(argv)
    args.rows = [int(r) for r in args.rows.split(",") if r]
    args.ops = [o for o in args.ops.split(",") if o]
    for op in args.ops:
        if op not in LABELS:
            parser.error(f"unknown op {op!r}; known: {','.join(ALL_OPS)}")
    if "numpy_xor" not in args.ops:
        args.ops.insert(0, "numpy_xor")  # the reference of the ratio column
    if args.width < 2 or args.width % 2:
        parser.error("--width must be even (the Adagrad delta is [var | accum], 2 * dim words)")
    if any(n < 1 or n > args.parity_rows for n in args.rows):
        parser.error("each of --rows must be in [1, --parity-rows] (ids are drawn without replacement)")
    if args.coef is None:
        args.coef = codec.Code(4, 2).coef(1, 1)
    if not 2 <= args.coef < 1 << 16:
        parser.error("--coef must be in [2, 65535] (1 is the XOR row)")
    return args


def chain(make: Callable[[], tf.Operation], inner: int) -> tf.Operation:
    """``inner`` copies of an op, each after the previous one."""
    last = None
    for _ in range(inner):
        with tf.control_dependencies([last] if last is not None else []):
            last = make()
    return last


def as_op(x) -> tf.Operation:
    return x if isinstance(x, tf.Operation) else x.op


def build(args: argparse.Namespace, sess_holder: list) -> tuple[list[Case], Callable[[], None]]:
    """Builds the graph and the NumPy buffers; returns the cases and a check."""
    rng = np.random.default_rng(args.seed)
    width, dim, prows = args.width, args.width // 2, args.parity_rows
    graph = tf.Graph()
    cases: list[Case] = []
    checks: list[Callable[[], None]] = []

    np_parity = rng.integers(-(2**31), 2**31, size=(prows, width), dtype=np.int32)
    with graph.as_default():
        parity = tf.Variable(np_parity, name="parity")
        parity_read = parity.read_value()
        table = tf.Variable(rng.normal(0, 0.1, (prows, dim)).astype(np.float32), name="table")
        accum = tf.Variable(np.full((prows, dim), 0.1, np.float32), name="accum")
        for n in args.rows:
            inner = max(1, round(args.sample_bytes / (n * width * 4)))
            rows_np = rng.choice(prows, size=n, replace=False).astype(np.int64)
            delta_np = rng.integers(-(2**31), 2**31, size=(n, width), dtype=np.int32)
            grad_np = rng.normal(0, 1, (n, dim)).astype(np.float32)
            rows = tf.constant(rows_np, name=f"rows_{n}")
            delta = tf.constant(delta_np, name=f"delta_{n}")
            grad = tf.constant(grad_np, name=f"grad_{n}")

            def tf_case(op: str, make: Callable[[], tf.Operation], n=n, inner=inner) -> None:
                target = chain(make, inner)
                cases.append(Case(op, n, inner, lambda: sess_holder[0].run(target)))

            def fold_delta():
                d = ec_ops.sparse_apply_adagrad_with_delta(table, accum, grad, rows, ADAGRAD_LR)
                return as_op(ec_ops.parity_update(parity, rows, d, coef=1))

            makers = {
                "parity_xor": lambda: as_op(ec_ops.parity_update(parity, rows, delta, coef=1)),
                "parity_gf": lambda: as_op(ec_ops.parity_update(parity, rows, delta, coef=args.coef)),
                "adagrad_stock": lambda: tf.raw_ops.ResourceSparseApplyAdagrad(
                    var=table.handle, accum=accum.handle, lr=ADAGRAD_LR, grad=grad, indices=rows
                ),
                "adagrad_delta": lambda: as_op(
                    ec_ops.sparse_apply_adagrad_with_delta(table, accum, grad, rows, ADAGRAD_LR)
                ),
                "adagrad_delta_fold": fold_delta,
            }
            for op in args.ops:
                if op in makers:
                    tf_case(op, makers[op])
                elif op == "numpy_xor":
                    a = rng.integers(-(2**31), 2**31, size=n * width, dtype=np.int32)
                    b = delta_np.reshape(-1).copy()

                    def run_xor(a=a, b=b, inner=inner):
                        for _ in range(inner):
                            np.bitwise_xor(a, b, out=a)

                    cases.append(Case(op, n, inner, run_xor))
                elif op == "numpy_fancy":

                    def run_fancy(rows_np=rows_np, delta_np=delta_np, inner=inner):
                        for _ in range(inner):
                            np_parity[rows_np] ^= delta_np

                    cases.append(Case(op, n, inner, run_fancy))

            if not args.no_check and n == min(args.rows):
                # One single op of each parity kind against NumPy / tf_ecrec.erasure.codec.
                one_xor = as_op(ec_ops.parity_update(parity, rows, delta, coef=1))
                one_gf = as_op(ec_ops.parity_update(parity, rows, delta, coef=args.coef))

                def check(one_xor=one_xor, one_gf=one_gf, rows_np=rows_np, delta_np=delta_np):
                    sess = sess_holder[0]
                    for target, expect in ((one_xor, delta_np), (one_gf, codec.gf_mul_bytes(args.coef, delta_np))):
                        before = sess.run(parity_read)
                        sess.run(target)
                        after = sess.run(parity_read)
                        want = before.copy()
                        want[rows_np] ^= expect
                        if not np.array_equal(after, want):
                            raise SystemExit(f"check failed: {target.name} does not match NumPy/codec")
                    print("check: parity_update (XOR and GF) matches NumPy/tf_ecrec.erasure.codec", file=sys.stderr)

                checks.append(check)
        noop = tf.no_op()
        init = tf.compat.v1.global_variables_initializer()

    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=args.threads, inter_op_parallelism_threads=1
    )
    sess = tf.compat.v1.Session(graph=graph, config=config)
    sess_holder[0] = sess
    sess.run(init)
    cases.append(Case("session_noop", 0, 1, lambda: sess.run(noop)))

    def run_checks():
        for check in checks:
            check()

    return cases, run_checks


def measure(cases: list[Case], repeats: int, warmup: int) -> None:
    for rep in range(-warmup, repeats):
        shift = rep % len(cases)
        for case in cases[shift:] + cases[:shift]:
            started = time.perf_counter()
            case.run()
            elapsed = time.perf_counter() - started
            if rep >= 0:
                case.seconds.append(elapsed / case.inner)


def fmt_bytes(b: float) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:g} {unit}"
    return f"{b:g} B"


def fmt_seconds(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} µs"


def report(args: argparse.Namespace, cases: list[Case]) -> str:
    by_key = {(c.op, c.n): c for c in cases}
    lines = [
        "| operation | shape | bytes per call | median s / call | GB/s | ratio to NumPy XOR limit |",
        "|---|---|---|---|---|---|",
    ]
    for n in args.rows:
        bytes_per_call = n * args.width * 4
        ref = by_key[("numpy_xor", n)]
        for op in ALL_OPS:
            case = by_key.get((op, n))
            if case is None:
                continue
            med = statistics.median(case.seconds)
            ratio = statistics.median(r / s for r, s in zip(ref.seconds, case.seconds))
            label = LABELS[op].format(coef=args.coef)
            if op == "numpy_xor":
                shape = f"2 x {n * args.width:,} int32"
            elif op.startswith("adagrad"):
                shape = f"{n:,} ids of [{args.parity_rows:,} x {args.width // 2}] f32 x2"
            else:
                shape = f"{n:,} rows of [{args.parity_rows:,} x {args.width}] int32"
            lines.append(
                f"| {label} | {shape} | {fmt_bytes(bytes_per_call)} | {fmt_seconds(med)} "
                f"| {bytes_per_call / med / 1e9:.2f} | {ratio:.2f} |"
            )

    # Overhead of producing the delta: paired per-repetition ratios to stock Adagrad.
    extra = []
    for n in args.rows:
        stock = by_key.get(("adagrad_stock", n))
        if stock is None:
            continue
        cells = []
        for op in ("adagrad_delta", "adagrad_delta_fold"):
            case = by_key.get((op, n))
            if case is None:
                cells.append("–")
                continue
            ratio = statistics.median(s / b for s, b in zip(case.seconds, stock.seconds))
            cells.append(f"{ratio:.2f}x")
        extra.append(f"| {n:,} | {fmt_seconds(statistics.median(stock.seconds))} | {' | '.join(cells)} |")
    if extra:
        lines += [
            "",
            "Adagrad: time per call relative to stock `ResourceSparseApplyAdagrad` "
            "(median of per-repetition ratios; 1.00x = no overhead)",
            "",
            "| ids per call | stock median | with delta | with delta + parity fold |",
            "|---|---|---|---|",
            *extra,
        ]
    noop = by_key[("session_noop", 0)]
    inners = ", ".join(f"{n:,} rows: {by_key[('numpy_xor', n)].inner}" for n in args.rows)
    lines += [
        "",
        f"{args.repeats} interleaved repetitions (+{args.warmup} warm-up), medians; TF intra-op threads "
        f"{args.threads}, TF {tf.__version__}, NumPy {np.__version__}; calls per timed sample ({inners}); "
        f"an empty `session.run` takes {fmt_seconds(statistics.median(noop.seconds))} (median), "
        "divided by the calls per sample in the TF rows.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    sess_holder: list = [None]
    cases, run_checks = build(args, sess_holder)
    print(f"graph built in {time.perf_counter() - started:.1f} s; {len(cases)} cases", file=sys.stderr)
    if not args.no_check:
        run_checks()
    t0 = time.perf_counter()
    measure(cases, args.repeats, args.warmup)
    print(f"measured in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(report(args, cases))
    sess_holder[0].close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
