"""The address a `PsReader`'s server listens at is one the PS tasks can dial back (multi-host verify)."""

from __future__ import annotations

import pytest

from tf_ecrec.check.live_cluster import dial_back_address
from tf_ecrec.errors import ConfigError


def test_ps_on_this_machine_dial_back_over_loopback() -> None:
    host, port = dial_back_address(["localhost:2222", "localhost:2223"]).rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536


@pytest.mark.parametrize("ps", [[], ["no-port"], ["host:http"]])
def test_a_missing_or_malformed_ps_address_is_a_config_error(ps: list[str]) -> None:
    with pytest.raises(ConfigError, match="PS address"):
        dial_back_address(ps)
