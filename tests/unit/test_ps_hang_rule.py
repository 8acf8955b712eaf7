"""The launcher's rule for a PS that does not answer its probe (tf_ecrec.launcher.ps_probe.is_hung): silence
beyond --ps-hang-secs is a hang unless the process spent a share of a core meanwhile, and then only for a while.
The same rule on real processes (a stopped server, a busy one): tests/integration/test_ps_probe.py."""

import pytest

from tf_ecrec.launcher.ps_probe import BUSY_GRACE, BUSY_SHARE, is_hung


@pytest.mark.parametrize("silent, share, hung", [
    (3.9, 0.0, False),                        # within the bound: never
    (4.1, 0.0, True),                         # stopped (SIGSTOP): no CPU at all
    (4.1, 0.02, True),                        # cut off or stuck: its heartbeat threads only
    (4.1, None, True),                        # no CPU reading (the process is gone from /proc): the silence decides
    (4.1, BUSY_SHARE, False),                 # working: a rebuild's slices on a shared machine
    (4.0 * BUSY_GRACE, 0.9, False),           # working, up to the grace
    (4.0 * BUSY_GRACE + 0.1, 0.9, True),      # past it: killed all the same
])
def test_silence_is_weighed_against_the_cpu_the_ps_spent(silent, share, hung):
    assert is_hung(silent, share, 4.0) is hung
