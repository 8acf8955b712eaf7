"""Hosts made of Linux network namespaces, for tests that put PS tasks and trainers on separate machines.

``hosts(["a", "b", "c"])`` makes one network namespace per host, each with a
loopback and an ``eth0`` at its own address on a private test subnet
(`SUBNET`), all plugged into one bridge that lives in a namespace of its own
(the switch).  Nothing is added to the root namespace: no interface, no
route, no address, so nothing outside the subnet is ever a target.  A process
runs on a host through ``host.run(argv)`` (``ip netns exec``, which keeps the
environment); ``host.link_down()`` pulls the host's cable at the switch (its
processes live on, its address and routes stay, packets to and from it
vanish) and ``host.link_up()`` plugs it back.  `HostCluster` is the
`harness.process_cluster.ProcessCluster` of a job whose tasks run on such hosts.

Lifecycle::

    with hosts(names) as net:   # takes a lock; removes what a killed earlier run left (its namespaces and
                                # the processes still in them); makes the switch and the hosts
        net["a"].run([...])     # argv prefix; tasks listen at net["a"].address
    # on exit, even after a failure: every process still in a namespace is killed, every namespace deleted

Needs root and iproute2's ``ip``; `unavailable` says why namespaces cannot be
made here (the tests skip with that message).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from harness import zygote
from harness.process_cluster import ProcessCluster, tf_config
from tf_ecrec.errors import ConfigError

SUBNET = "10.231.7"
"""The test subnet, 10.231.7.0/24: the switch has no address, hosts get .11 upwards."""
PREFIX = "tfecrec-"
"""Every namespace the harness makes is named with this prefix (and only those are ever removed)."""
SWITCH = PREFIX + "switch"
FIRST_HOST = 11
_NAME = re.compile(r"[a-z][a-z0-9]{0,7}$")  # "p-" + name must fit an interface name (15 characters)
_LOCK = os.path.join(tempfile.gettempdir(), "tf_ecrec_netns.lock")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why network namespaces cannot be made on this machine, or None if they can (probed by making one)."""
    if shutil.which("ip") is None:
        return "cannot create network namespaces: no `ip` command (install Debian's iproute2: tests/setup_machine.sh)"
    if os.geteuid() != 0:
        return f"cannot create network namespaces: not root (euid {os.geteuid()}); `ip netns add` needs CAP_SYS_ADMIN"
    probe = f"{PREFIX}probe{os.getpid()}"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"cannot create network namespaces: `ip netns add {probe}` failed: {done.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Host:
    """One test host: a network namespace with ``eth0`` at `address` on the test subnet."""

    def __init__(self, name: str, address: str) -> None:
        self.name = name
        self.netns = PREFIX + name
        self.address = address
        self._port = "p-" + name  # the switch's end of the host's cable

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address!r})"

    def run(self, argv: Sequence[str]) -> list[str]:
        """`argv` to be run on this host (the environment is kept)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def python(self, argv: Sequence[str]) -> list[str]:
        """Python's `argv` (``sys.executable ...``) to be forked by `harness.zygote` onto this host (`harness.in_netns`)."""
        if not argv or argv[0] != sys.executable:
            raise ValueError(f"not a Python command line: {list(argv)}")
        return [sys.executable, "-m", "harness.in_netns", self.netns, *argv[1:]]

    def link_down(self) -> None:
        """Pulls the host's cable at the switch: its processes and its address stay, its packets are lost."""
        _ip("-n", SWITCH, "link", "set", self._port, "down")

    def link_up(self) -> None:
        """Plugs the cable back."""
        _ip("-n", SWITCH, "link", "set", self._port, "up")

    def listening(self, port: int) -> bool:
        """Whether a process on this host listens on TCP `port`."""
        done = subprocess.run(self.run(["ss", "-Hltn", f"sport = :{port}"]), capture_output=True, text=True, timeout=30)
        return done.returncode == 0 and bool(done.stdout.strip())

    def wait_listening(self, port: int, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
        """Waits until a process on this host listens on `port` (AssertionError after `timeout` or once not `alive`)."""
        deadline = time.monotonic() + timeout
        while not self.listening(port):
            if time.monotonic() > deadline or not alive():
                raise AssertionError(f"nothing listens on {self.address}:{port} after {timeout:.0f} s")
            time.sleep(0.3)

    def tcp_peers(self, port: int) -> dict[str, int]:
        """Bytes received so far on each TCP connection to local `port`, by ``peer_address:peer_port`` (IPv4)."""
        done = subprocess.run(self.run(["ss", "-Htni", "state", "all", f"sport = :{port}"]),
                              capture_output=True, text=True, timeout=30)
        out: dict[str, int] = {}
        peer = None
        for line in done.stdout.splitlines():
            fields = line.split()
            if fields and not line[:1].isspace() and fields[0] != "LISTEN":
                peer = _plain(fields[-1]) if len(fields) >= 4 else None
                if peer is not None:
                    out[peer] = 0
            received = re.search(r"bytes_received:(\d+)", line)
            if received and peer is not None:
                out[peer] = int(received.group(1))
        return out


    def tcp_written(self, address: str, port: int) -> dict[str, tuple[int, int]]:
        """Bytes the processes on this host have written so far on each TCP connection to `address`:`port`.

        By ``local_address:local_port`` (how the far end names the connection): ``(acked, written)``, the
        bytes the far end has acknowledged and those plus the send queue (written, not yet acknowledged), so
        while the far end is unreachable `written` is every byte the connection will ever deliver of what was
        written until then, and the sender's next data segment starts at stream offset `acked`.
        """
        done = subprocess.run(self.run(["ss", "-Htni", "state", "all", f"dst = {address}", f"dport = :{port}"]),
                              capture_output=True, text=True, timeout=30)
        out: dict[str, tuple[int, int]] = {}
        local, queue = None, 0
        for line in done.stdout.splitlines():
            fields = line.split()
            if fields and not line[:1].isspace():
                local = _plain(fields[3]) if len(fields) >= 5 else None
                queue = int(fields[2]) if local is not None else 0  # Send-Q
                if local is not None:
                    out[local] = (0, queue)
            acked = re.search(r"bytes_acked:(\d+)", line)
            if acked and local is not None:
                out[local] = (int(acked.group(1)), int(acked.group(1)) + queue)
        return out

    @contextlib.contextmanager
    def capture(self, port: int, out: str) -> Iterator[str]:
        """Records the TCP segments arriving on this host for `port` while the block runs (`harness.h2_capture`)."""
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "h2_capture.py")
        proc = subprocess.Popen(self.run([sys.executable, script, str(port), out]), stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "the capture did not start"
            yield out
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _plain(endpoint: str) -> str:
    """``[::ffff:10.0.0.1]:80`` and ``10.0.0.1:80`` as ``10.0.0.1:80``."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    return f"{host.removeprefix('::ffff:')}:{port}"


class Network(Mapping[str, Host]):
    """The hosts of one `hosts` context, by name."""

    def __init__(self, hosts: Sequence[Host]) -> None:
        self._hosts = {h.name: h for h in hosts}

    def __getitem__(self, name: str) -> Host:
        return self._hosts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)


def _ours() -> list[str]:
    listed = _ip("netns", "list").stdout.split("\n")
    return [line.split()[0] for line in listed if line.startswith(PREFIX)]


def _remove(netns: str) -> None:
    """Kills every process left in `netns` (by pid: only this harness starts processes there), deletes it."""
    pids = _ip("netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pids and time.monotonic() < deadline:
        pids = _ip("netns", "pids", netns, check=False).stdout.split()
        time.sleep(0.1)
    _ip("netns", "del", netns, check=False)


def _make(names: Sequence[str]) -> list[Host]:
    _ip("netns", "add", SWITCH)
    _ip("-n", SWITCH, "link", "set", "lo", "up")
    _ip("-n", SWITCH, "link", "add", "br0", "type", "bridge")
    _ip("-n", SWITCH, "link", "set", "br0", "up")
    made = []
    for i, name in enumerate(names):
        host = Host(name, f"{SUBNET}.{FIRST_HOST + i}")
        _ip("netns", "add", host.netns)
        _ip("-n", host.netns, "link", "set", "lo", "up")  # TensorFlow's own tools dial 127.0.0.1
        _ip("-n", SWITCH, "link", "add", host._port, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("-n", SWITCH, "link", "set", host._port, "master", "br0", "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        made.append(host)
    return made


@contextlib.contextmanager
def hosts(names: Sequence[str]) -> Iterator[Network]:
    """Hosts `names` on the test subnet for the duration of the block (see the module doc).

    Raises:
      ConfigError: a name that is not 1-8 lowercase letters and digits
        (starting with a letter), a repeated name, or more than 200 hosts.
    """
    names = list(names)
    bad = [n for n in names if not _NAME.match(n)]
    if bad or len(set(names)) != len(names) or not 0 < len(names) <= 200:
        raise ConfigError(f"host names {names}; rule: 1 to 200 distinct names of 1-8 lowercase letters and digits, "
                          "starting with a letter; source: harness.netns.hosts")
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one multi-host test at a time on this machine
        for leftover in _ours():  # a run killed before its teardown
            _remove(leftover)
        try:
            yield Network(_make(names))
        finally:
            for netns in _ours():
                if netns != SWITCH:
                    _remove(netns)
            _remove(SWITCH)


class HostCluster(ProcessCluster):
    """A `ProcessCluster` whose tasks run on hosts: each task at its host's address (``placement``).

    Tasks on one host get ports `port`, `port` + 1, ...; hosts are separate
    machines, so every host's first task takes `port`.  `move` puts a task on
    another host (a new address, not a new port), and the next `start` starts
    it there with a TF_CONFIG naming its new address.
    """

    def __init__(self, command: Sequence[str], placement: Mapping[str, Host], log_dir: str,
                 env: dict[str, str] | None = None, port: int = 2222) -> None:
        jobs: dict[str, int] = {}
        for task in placement:
            jobs[task.split(":")[0]] = jobs.get(task.split(":")[0], 0) + 1
        super().__init__(command, jobs, log_dir, env=env)
        self._port = port
        self.placement = dict(placement)
        self.cluster = {t: ["" for _ in range(n)] for t, n in jobs.items() if t != "evaluator"}
        for task in sorted(self.placement):
            self._place(task, self.placement[task])

    def _place(self, task: str, host: Host) -> None:
        task_type, index = task.split(":")
        self.placement[task] = host
        if task_type not in self.cluster:  # an evaluator is not in the cluster
            return
        taken = {a for addresses in self.cluster.values() for a in addresses}
        port = self._port
        while f"{host.address}:{port}" in taken:
            port += 1
        self.cluster[task_type][int(index)] = f"{host.address}:{port}"

    def address(self, task: str) -> str:
        task_type, index = task.split(":")
        return self.cluster[task_type][int(index)]

    def move(self, task: str, host: Host) -> str:
        """Puts `task` (not running) on `host`; returns its new address."""
        task_type, index = task.split(":")
        self.cluster[task_type][int(index)] = ""
        self._place(task, host)
        return self.address(task)

    def log_file(self, task: str) -> str:
        """The log of `task` on the host it is placed on now (a moved task starts a new log)."""
        return os.path.join(self.log_dir, f"{task.replace(':', '-')}@{self.placement[task].name}.log")

    def log(self, task: str) -> str:
        if not os.path.exists(self.log_file(task)):
            return ""
        with open(self.log_file(task), encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def start(self, task: str) -> None:
        task_type, index = task.split(":")
        env = {**self.env, "TF_CONFIG": tf_config(self.cluster, task_type, int(index))}
        with open(self.log_file(task), "ab") as out:  # forked: TensorFlow's import is done (`harness.in_netns`)
            self.tasks[task] = zygote.popen(self.placement[task].python(self.command), env=env, stdout=out,
                                            stderr=subprocess.STDOUT, name=task)
