"""Pure parts of flash checkpoints: the interval, the manifest, which snapshot a restore reads,
the trainers' indices, the launcher's flags, and a PS's SIGTERM copy to disk."""

from __future__ import annotations

import os
import types

import pytest

from tf_ecrec.errors import ConfigError
from tf_ecrec.flash.config import (
    FILES,
    MANIFEST,
    Copy,
    FlashConfig,
    Manifest,
    Tier,
    choose,
    early_steps,
    job_key,
    shm_root,
    slot_dir,
)
from tf_ecrec.launcher.job.spec import JobSpec

NAMES = {0: ("a", "b"), 1: ("c",), 2: ("d", "e")}


def copy(tier: Tier, ps: int, epoch: int, step: int, slot: int = 0, names: tuple[str, ...] | None = None,
         num_ps: int = 3) -> Copy:
    return Copy(tier, slot, Manifest(epoch, step, ps, num_ps, names if names is not None else NAMES[ps]))


@pytest.mark.parametrize("kwargs", [
    {}, {"every_steps": -1}, {"every_steps": 1.5}, {"every_secs": -1.0}, {"every_steps": 10, "persist_every": -1},
    {"every_steps": 10, "park_secs": 0}, {"every_steps": 10, "shm_dir": "relative/dir"},
])
def test_a_bad_interval_or_directory_is_refused_by_name(kwargs):
    with pytest.raises(ConfigError) as err:
        FlashConfig(**kwargs)
    assert "rule:" in str(err.value) and "source:" in str(err.value)


def test_a_snapshot_is_due_by_steps_or_seconds():
    by_steps = FlashConfig(every_steps=100)
    assert not by_steps.due(199, 100, 1e9, 0.0)
    assert by_steps.due(200, 100, 0.0, 0.0)
    by_secs = FlashConfig(every_secs=5.0)
    assert not by_secs.due(10**6, 0, 4.9, 0.0)
    assert by_secs.due(0, 0, 5.0, 0.0)
    assert not by_secs.due(10**6, 0, 4.9, 0.0, early_steps=50)  # the bound is in steps


def test_rounds_start_early_by_what_the_last_ones_took_so_no_complete_snapshot_is_older_than_the_interval():
    config = FlashConfig(every_steps=100)
    assert early_steps([]) == 0 and early_steps([0, -3]) == 0
    assert early_steps([30, 41, 12]) == 41 + 5  # the worst, plus a tenth of it (rounded up)
    early = early_steps([41])
    assert not config.due(100 + 100 - early - 1, 100, 0.0, 0.0, early) and config.due(100 + 100 - early, 100, 0.0, 0.0, early)
    assert config.due(101, 100, 0.0, 0.0, early_steps=500)  # never more than once a step
    # A model of the rounds: each is written `late` steps after it is due; with the early start, the newest
    # complete snapshot is never more than 100 steps behind, while rounds without it let it reach 100 + late.
    for late in (5, 35, 60):
        for adapt in (True, False):
            last, complete, lateness, worst, step, pending = 0, 0, [], 0, 0, None
            while step < 5000:
                step += 1
                worst = max(worst, step - complete) if complete else worst
                if pending is not None and step >= pending[1]:
                    complete, pending = pending[0], None
                    lateness.append(late)
                e = early_steps(lateness[-4:]) if adapt else 0
                if pending is None and config.due(step, last, 0.0, 0.0, e):
                    due_at = last + max(1, 100 - e)
                    last, pending = step, (step, due_at + late)
            assert (worst <= 100) == adapt, (late, adapt, worst)


def test_the_manifest_round_trips_and_an_emptied_one_is_no_manifest():
    m = Manifest(7, 1200, 1, 3, ("x", "y"))
    assert Manifest.decode(m.encode()) == m
    assert Manifest.decode(b"") is None
    assert Manifest.decode(b'{"format": 99}') is None
    assert Manifest.decode(b"\xff\xfe") is None


def test_paths_are_per_job_per_ps_per_slot_and_disk_is_in_the_model_dir(tmp_path):
    config = FlashConfig(every_steps=1, shm_dir="/dev/shm/x")
    root = shm_root(config, str(tmp_path / "a"))
    assert root.startswith("/dev/shm/x/") and root != shm_root(config, str(tmp_path / "b"))
    assert job_key(str(tmp_path)) == job_key(str(tmp_path) + "/")
    own = slot_dir(Tier.OWN, 2, 1, root=root, model_dir="/m")
    peer = slot_dir(Tier.PEER, 2, 1, root=root, model_dir="/m")
    assert own != peer and own.startswith(root) and peer.startswith(root)
    assert slot_dir(Tier.DISK, 2, 1, root=root, model_dir="/m") == "/m/flash/ps2/slot1"
    assert len(set(FILES)) == 2


def test_the_newest_epoch_complete_on_every_ps_is_chosen():
    found = [copy(Tier.OWN, p, 10, 100) for p in range(3)] + [copy(Tier.OWN, p, 20, 200, slot=1) for p in (0, 1)]
    choice = choose(found, 3, NAMES)
    assert choice is not None and choice.epoch == 10 and choice.global_step == 100 and choice.method == "memory"
    # PS 2's copy of epoch 20 on its peer completes it
    choice = choose(found + [copy(Tier.PEER, 2, 20, 200, slot=1)], 3, NAMES)
    assert choice is not None and choice.epoch == 20 and choice.copies[2].tier is Tier.PEER


def test_own_is_preferred_to_peer_and_memory_to_disk_and_disk_says_so():
    found = [copy(t, p, 5, 50) for p in range(3) for t in (Tier.DISK, Tier.PEER, Tier.OWN)]
    choice = choose(found, 3, NAMES)
    assert choice is not None and all(c.tier is Tier.OWN for c in choice.copies.values())
    only_disk = choose([copy(Tier.DISK, p, 5, 50) for p in range(3)], 3, NAMES)
    assert only_disk is not None and only_disk.method == "disk"


def test_a_copy_of_another_model_or_cluster_shape_is_never_chosen():
    assert choose([copy(Tier.OWN, 0, 5, 50, names=("a",)), copy(Tier.OWN, 1, 5, 50), copy(Tier.OWN, 2, 5, 50)], 3, NAMES) is None
    assert choose([copy(Tier.OWN, p, 5, 50, num_ps=4) for p in range(3)], 3, NAMES) is None
    assert choose([copy(Tier.OWN, 0, 5, 50), copy(Tier.OWN, 1, 5, 50), copy(Tier.OWN, 2, 5, 51)], 3, NAMES) is None
    assert choose([], 3, NAMES) is None


def _run_config(task_type, task_id, cluster, is_chief):
    return types.SimpleNamespace(cluster_spec=types.SimpleNamespace(as_dict=lambda: cluster),
                                 task_type=task_type, task_id=task_id, is_chief=is_chief)


def test_trainer_indices_put_the_chief_first():
    from tf_ecrec.flash.hooks import trainer_index

    cluster = {"chief": ["c"], "worker": ["w0", "w1"], "ps": ["p"]}
    assert trainer_index(_run_config("chief", 0, cluster, True)) == (0, 3)
    assert trainer_index(_run_config("worker", 1, cluster, False)) == (2, 3)
    no_chief = {"worker": ["w0", "w1"], "ps": ["p"]}
    assert trainer_index(_run_config("worker", 0, no_chief, True)) == (0, 2)
    assert trainer_index(_run_config("worker", 1, no_chief, False)) == (1, 2)


def test_the_launcher_takes_a_flash_interval_with_ecrec_or_flash_only():
    job = JobSpec(fault_tolerance="ecrec", flash_checkpoint_steps=100)
    assert job.flash == FlashConfig(every_steps=100)
    assert JobSpec(fault_tolerance="ecrec").flash is None
    # TF2: the coordinator takes the rounds (tf_ecrec.pss.flash)
    assert JobSpec(fault_tolerance="ecrec", strategy="pss", flash_checkpoint_secs=1.0).flash == FlashConfig(every_secs=1.0)
    assert JobSpec.from_json(job.to_json()).flash == job.flash
    # flash on its own: every 100 steps unless told, no stock checkpoints unless told
    assert JobSpec(fault_tolerance="flash").flash == FlashConfig(every_steps=100)
    assert JobSpec(fault_tolerance="flash", flash_checkpoint_secs=5.0).flash == FlashConfig(every_secs=5.0)
    assert JobSpec(fault_tolerance="flash").checkpoint_interval == {"save_checkpoints_steps": None,
                                                                    "save_checkpoints_secs": None}
    for bad in ({"fault_tolerance": "checkpoint", "flash_checkpoint_steps": 100},
                {"fault_tolerance": "ecrec", "flash_checkpoint_steps": 0},
                {"fault_tolerance": "flash", "flash_checkpoint_steps": 0},
                {"fault_tolerance": "ecrec", "flash_checkpoint_steps": 10, "flash_checkpoint_secs": 1.0},
                {"fault_tolerance": "flash", "strategy": "pss"}):
        with pytest.raises(ConfigError):
            JobSpec(**bad)


def test_sigterm_persists_the_newest_complete_copy_and_keeps_the_older_disk_slot(tmp_path):
    from tf_ecrec.flash.persist import persist_newest

    config = FlashConfig(every_steps=1, shm_dir=str(tmp_path / "shm"))
    model_dir = str(tmp_path / "model")
    root = shm_root(config, model_dir)

    def put(tier, slot, manifest, payload):
        d = slot_dir(tier, 1, slot, root=root, model_dir=model_dir)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, FILES[1]), "wb") as fh:
            fh.write(payload)
        with open(os.path.join(d, MANIFEST), "wb") as fh:
            fh.write(manifest.encode() if manifest else b"")

    assert persist_newest(config, model_dir, 1) is None  # nothing in memory
    put(Tier.OWN, 0, Manifest(3, 30, 1, 3, ("c",)), b"old")
    put(Tier.OWN, 1, Manifest(4, 40, 1, 3, ("c",)), b"new")
    put(Tier.DISK, 0, Manifest(2, 20, 1, 3, ("c",)), b"disk2")
    put(Tier.DISK, 1, Manifest(1, 10, 1, 3, ("c",)), b"disk1")
    got = persist_newest(config, model_dir, 1)
    assert got is not None and got.epoch == 4
    d1 = slot_dir(Tier.DISK, 1, 1, root=root, model_dir=model_dir)  # the older disk slot was replaced
    assert open(os.path.join(d1, FILES[1]), "rb").read() == b"new"
    assert Manifest.decode(open(os.path.join(d1, MANIFEST), "rb").read()).epoch == 4
    d0 = slot_dir(Tier.DISK, 1, 0, root=root, model_dir=model_dir)
    assert open(os.path.join(d0, FILES[1]), "rb").read() == b"disk2"
    assert persist_newest(config, model_dir, 1).epoch == 4  # already persisted: nothing rewritten
