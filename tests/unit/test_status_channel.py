"""The status channel on loopback: kinds go on the wire as their string values, in order, never blocking."""

from __future__ import annotations

from tf_ecrec.launcher.job.status import StatusKind, StatusReceiver, StatusSender


def _receive(receiver: StatusReceiver, count: int) -> list[dict]:
    messages: list[dict] = []
    for _ in range(50):
        messages += receiver.poll(0.1)
        if len(messages) >= count:
            break
    return messages


def test_a_kind_goes_on_the_wire_as_its_value_with_the_task_and_fields():
    receiver = StatusReceiver()
    sender = StatusSender(receiver.address, "worker:1")
    try:
        sender.send(StatusKind.FAILOVER, state="wait", reason="PS moved")
        sender.send("step", step=7, records=64)  # what ThroughputHook sends through it
        messages = _receive(receiver, 2)
    finally:
        sender.close()
        receiver.close()
    assert [m["kind"] for m in messages] == ["failover", "step"]
    assert messages[0] == {**messages[0], "task": "worker:1", "state": "wait", "reason": "PS moved"}
    assert StatusKind(messages[1]["kind"]) is StatusKind.STEP and messages[1]["records"] == 64


def test_a_sender_without_a_listener_neither_raises_nor_blocks():
    receiver = StatusReceiver()
    address = receiver.address
    receiver.close()
    sender = StatusSender(address, "chief:0")
    for step in range(100):
        sender.send(StatusKind.STEP, step=step, records=1)
    sender.close()
