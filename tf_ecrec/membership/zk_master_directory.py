"""Where the job master is, advertised in ZooKeeper: one live master per job.

Znodes under the job path ``/<job>``::

    /<job>/master         ephemeral; JSON {"address", "state_dir", "host", "pid", ...}
    /<job>/master_state   persistent; where the last master kept state (no pid)

:class:`ZkMasterDirectory` creates the ephemeral znode, waits out a dead
predecessor's (its session ends within the session timeout) and refuses to
run beside a live one.  After a lost session the owner calls
:meth:`ZkMasterDirectory.recreate` from its worker thread.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Mapping
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from tf_ecrec.errors import MasterError
from tf_ecrec.membership.zk_connection import ZkConnection

_LOG = logging.getLogger(__name__)


class ZkMasterDirectory:
    """The master znode of one job on a :class:`ZkConnection`.  Thread-safe.

    Args:
      connection: A started connection.
      job_path: The job's znode.
    """

    def __init__(self, connection: ZkConnection, job_path: str) -> None:
        self._zk = connection
        self.job_path = job_path
        self._lock = threading.Lock()
        self._published: dict[str, Any] | None = None

    def publish(self, address: str, details: Mapping[str, Any]) -> None:
        """Advertises this process as the master; waits out a dead predecessor's znode.

        Raises:
          MasterError: another master's znode outlived the session timeout,
            so another master is live.
        """
        info = dict(details, address=address, host=socket.gethostname())
        with self._lock:
            self._published = info
        client = self._zk.client
        self._zk.op(client.ensure_path, self.job_path)
        self._create(info)
        self._zk.op(client.ensure_path, f"{self.job_path}/master_state")
        self._zk.op(client.set, f"{self.job_path}/master_state",
                    json.dumps({k: info[k] for k in info if k != "pid"}).encode())
        _LOG.info("Published master %s at %s/master", address, self.job_path)

    def address(self) -> str | None:
        """Returns the live master's address, or ``None``."""
        try:
            data, _ = self._zk.op(self._zk.client.get, f"{self.job_path}/master")
        except NoNodeError:
            return None
        return json.loads(data.decode()).get("address")

    def recreate(self) -> None:
        """Re-creates the master znode after a lost session, if this process published one."""
        with self._lock:
            info = self._published
        if info is not None:
            self._create(info)

    def _create(self, info: dict[str, Any]) -> None:
        client = self._zk.client
        path = f"{self.job_path}/master"
        data = json.dumps(info).encode()
        gone = threading.Event()
        wait = self._zk.session_timeout * 1.5 + 1.0
        for _ in range(10):
            try:
                self._zk.op(client.create, path, data, ephemeral=True)
                return
            except NodeExistsError:
                pass
            try:
                holder, stat = self._zk.op(client.get, path)
            except NoNodeError:
                continue
            if stat.ephemeralOwner == self._zk.session_id:
                self._zk.op(client.set, path, data)
                return
            gone.clear()
            exists = self._zk.op(client.exists, path, watch=lambda event: gone.set())
            if exists is None:
                continue
            _LOG.info("Another master's znode %s exists; waiting up to %.0fs for its session "
                      "to end", path, wait)
            if not gone.wait(wait):
                raise MasterError(
                    f"another master is live: {path} = {holder!r} outlived {wait:.0f}s; "
                    "rule: one master per job")
        raise MasterError(f"could not create {path}: masters kept replacing each other")
