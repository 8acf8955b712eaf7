"""The launcher's CPU accounting (tf_ecrec.launcher.cpu_usage): real processes read from /proc, and the
per-1,000-samples figure over the steady window."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tf_ecrec.launcher.cpu_usage import CpuMeter, cpu_seconds, cpu_section, role_of

BUSY = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < float(sys.argv[1]): pass\n" \
       "print(time.process_time(), flush=True)\nsys.stdin.read()\n"


def test_a_process_cpu_is_read_from_proc_and_a_gone_one_is_none():
    proc = subprocess.Popen([sys.executable, "-c", BUSY, "0.6"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        own = float(proc.stdout.readline())  # the child's own count, once it has spun
        seen = cpu_seconds(proc.pid)
        assert seen is not None and own - 0.05 <= seen <= own + 0.3, (seen, own)
    finally:
        proc.communicate("")
    assert cpu_seconds(proc.pid) is None  # reaped: gone


def test_the_meter_keeps_an_ended_process_last_reading_and_splits_by_role():
    meter = CpuMeter()
    ps = subprocess.Popen([sys.executable, "-c", BUSY, "0.4"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    spare = subprocess.Popen([sys.executable, "-c", BUSY, "0.2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        ps_own, spare_own = float(ps.stdout.readline()), float(spare.stdout.readline())
        meter.sample(time.time(), [("ps:0", ps.pid), ("spare:0", spare.pid)])
    finally:
        ps.communicate("")
        spare.communicate("")
    meter.sample(time.time(), [("ps:0", ps.pid)], force=True)  # ended: its last reading stays
    (_, first), (_, last) = meter.series
    assert first == last
    assert set(last) == {"ps"} and ps_own + spare_own - 0.05 <= last["ps"] <= ps_own + spare_own + 0.5, last


def test_roles():
    assert [role_of(t) for t in ("ps:1", "spare:0", "chief:0", "worker:3")] == ["ps", "ps", "chief", "worker"]


def test_the_window_counts_cpu_between_its_first_and_last_samples_over_the_records_between():
    # Datagrams every 0.5 s from t=10.5, step 10 more each; warm-up ends at the step-20 datagram (t=11).
    timeline = [(10.0 + 0.5 * i, 10 * i, 100) for i in range(1, 13)]  # t 10.5..16, steps 10..120, 100 records each
    series = [(10.5, {"ps": 0.5}), (11.0, {"ps": 1.0, "chief": 2.0}), (12.0, {"ps": 2.0, "chief": 3.0}),
              (16.0, {"ps": 6.0, "chief": 6.0, "worker": 1.0}), (30.0, {"ps": 9.0, "chief": 9.0, "worker": 9.0})]
    out = cpu_section(series, timeline, warmup_step=20)
    # Window: the samples at 11 and 16 (the first at or after the step-20 datagram, the last at or before
    # the last datagram); records after 11 up to 16: t = 11.5 .. 16, 10 datagrams of 100.
    assert out["window_seconds"] == 5.0
    assert out["cpu_seconds_per_1000_samples"] == pytest.approx((13.0 - 3.0) / 1000 * 1000)
    assert out["cpu_seconds_per_1000_samples_by_role"] == {"ps": 5.0, "chief": 4.0, "worker": 1.0}
    assert out["cpu_seconds"] == 27.0 and out["cpu_seconds_by_role"] == {"ps": 9.0, "chief": 9.0, "worker": 9.0}


def test_no_window_without_steps_or_samples():
    assert cpu_section([], [(1.0, 50, 10)], warmup_step=1)["cpu_seconds_per_1000_samples"] is None
    assert cpu_section([(1.0, {"ps": 1.0})], [], warmup_step=1)["cpu_seconds_per_1000_samples"] is None
    assert cpu_section([(1.0, {"ps": 1.0}), (2.0, {"ps": 2.0})], [(0.5, 1, 10)], warmup_step=1)[
        "cpu_seconds_per_1000_samples"] is None  # no sample inside the steps' window
