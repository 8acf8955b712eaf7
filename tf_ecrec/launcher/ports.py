"""Ports for a launched job's tasks on loopback: consecutive from a base, or any free ones.

Free ports are drawn at random from below the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), not by binding port 0: a port of that range can be
taken between this pick and the task's own bind by any outgoing connection on the machine (the
task then dies with TensorFlow's "Could not start gRPC server"), while a port below it is only ever
taken by an explicit bind.  Each pick is still checked by binding it.  ``TF_ECREC_PORT_RANGE=LO-HI``
narrows the draw to ports LO..HI (a firewall's open range; the test suite gives each of its workers
its own, so that two jobs launched at once never draw the same port).
"""

from __future__ import annotations

import os
import random
import socket

from tf_ecrec.errors import ConfigError, LaunchError

ENV_PORT_RANGE = "TF_ECREC_PORT_RANGE"

_LOWEST = 20000  # above the well-known and most registered service ports
_TRIES = 2000


def ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def pick_ports(count: int, base_port: int = 0, host: str = "127.0.0.1") -> list[int]:
    """`count` free ports: consecutive from `base_port`, or any free ones below the ephemeral range when
    it is 0 (module docstring).

    Raises:
      LaunchError: a requested port is in use (naming it), or no free port was found.
    """
    if base_port:
        return [_bind_check(host, base_port + i, base_port, count) for i in range(count)]
    low, high = port_range()
    rng = random.SystemRandom()
    ports: list[int] = []
    for _ in range(_TRIES):
        if len(ports) == count:
            break
        port = rng.randrange(low, high)
        if port not in ports and _free(host, port):
            ports.append(port)
    if len(ports) < count:
        raise LaunchError(f"found {len(ports)} of {count} free ports on {host} in {low}..{high - 1} after "
                          f"{_TRIES} tries; pass --base-port; source: --base-port 0, {ENV_PORT_RANGE}")
    return ports


def port_range(environ: dict[str, str] | None = None) -> tuple[int, int]:
    """The ports free ones are drawn from, as ``[low, high)``: ``TF_ECREC_PORT_RANGE`` or the default.

    Raises:
      ConfigError: the variable is not ``LO-HI`` with 1 <= LO <= HI <= 65535.
    """
    value = (os.environ if environ is None else environ).get(ENV_PORT_RANGE, "").strip()
    if not value:
        return _LOWEST, max(_LOWEST + 1000, ephemeral_start())
    lo, sep, hi = value.partition("-")
    try:
        low, last = int(lo), int(hi)
    except ValueError:
        low, last = 0, -1
    if not sep or not 1 <= low <= last <= 65535:
        raise ConfigError(f"{ENV_PORT_RANGE}={value!r} must be LO-HI with 1 <= LO <= HI <= 65535; "
                          f"source: the environment")
    return low, last + 1


def _free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _bind_check(host: str, port: int, base_port: int, count: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise LaunchError(
                f"port {host}:{port} is in use ({exc.strerror}); the job needs ports "
                f"{base_port}..{base_port + count - 1}; pick another --base-port or 0 for free ports; "
                "source: --base-port"
            ) from exc
    return port
