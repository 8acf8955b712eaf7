"""The launcher's ports: consecutive from a base, else drawn from a range below the ephemeral one."""

import socket

import pytest

from tf_ecrec.errors import ConfigError, LaunchError
from tf_ecrec.launcher import ports


def test_free_ports_are_distinct_free_and_inside_the_configured_range(monkeypatch):
    monkeypatch.setenv(ports.ENV_PORT_RANGE, "")
    low, high = ports.port_range()
    assert low == 20000 and high <= 65536
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
        assert high == max(21000, int(fh.read().split()[0]))  # never the ephemeral range
    picked = ports.pick_ports(8)
    assert len(set(picked)) == 8 and all(low <= p < high for p in picked)
    for port in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_environment_narrows_the_range_and_a_full_range_is_a_typed_error(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setenv(ports.ENV_PORT_RANGE, f"{taken}-{taken}")
        assert ports.port_range() == (taken, taken + 1)
        with pytest.raises(LaunchError, match=f"{taken}..{taken}"):
            ports.pick_ports(1)
        with pytest.raises(LaunchError, match=f"port 127.0.0.1:{taken} is in use"):
            ports.pick_ports(1, base_port=taken)


@pytest.mark.parametrize("value", ["30000", "9-x", "40000-30000", "0-10", "1-70000"])
def test_a_malformed_range_names_the_variable_and_the_rule(value):
    with pytest.raises(ConfigError, match=f"TF_ECREC_PORT_RANGE='{value}' must be LO-HI"):
        ports.port_range({ports.ENV_PORT_RANGE: value})
