"""Facts of TensorFlow 2.15's ParameterServerStrategy the TF2 design stands on (docs/pss.md).

Each case runs in a fresh interpreter: a strategy connects the process's eager context to its
cluster, which no other test of this process may inherit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.pss_cluster import exit_with


def _port() -> int:
    from harness.ports import free_port

    return free_port()


def _cluster(num_ps: int) -> tuple[dict[str, list[str]], dict[tuple[str, int], Any], Callable[[str, int], None]]:
    """Bare TF servers (no tf_ecrec in them), forked from one fork server (`harness.pss_cluster.ServerForks`)."""
    from harness.pss_cluster import ServerForks

    spec = {"worker": [f"localhost:{_port()}"], "ps": [f"localhost:{_port()}" for _ in range(num_ps)],
            "chief": [f"localhost:{_port()}"]}
    procs: dict[tuple[str, int], Any] = {}
    forks = ServerForks(plain=True)

    def start(job: str, index: int) -> None:
        procs[(job, index)] = forks.start(spec, job, index)

    start("worker", 0)
    for index in range(num_ps):
        start("ps", index)
    return spec, procs, start


def _strategy(spec):
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    return tf.distribute.experimental.ParameterServerStrategy(resolver)


def placement_case() -> None:
    def case() -> None:
        import tensorflow as tf

        spec, procs, _ = _cluster(3)
        try:
            strategy = _strategy(spec)
            with strategy.scope():
                anchors = [tf.Variable(0, name=f"anchor{i}") for i in range(3)]
                assert [tf.DeviceSpec.from_string(a.device).task for a in anchors] == [0, 1, 2]
                wanted = [2, 0, 1, 2, 2]
                chunks = []
                for j, ps in enumerate(wanted):
                    with strategy.extended.colocate_vars_with(anchors[ps]):
                        chunks.append(tf.Variable(tf.zeros([8, 2]), name=f"chunk{j}"))
                optimizer = tf.keras.optimizers.Adagrad(0.1)
                optimizer.build(chunks)
            # The chosen PS, not the creation counter's (which would give 0, 1, 2, 0, 1 after the anchors).
            assert [tf.DeviceSpec.from_string(c.device).task for c in chunks] == wanted
            slots = {v.name.split("/")[-1].split(":")[0]: tf.DeviceSpec.from_string(v.device).task
                     for v in optimizer.variables if v.name.startswith("accumulator/")}
            assert slots == {f"chunk{j}": ps for j, ps in enumerate(wanted)}, slots  # slots follow their variable
        finally:
            for proc in procs.values():
                proc.kill()

    exit_with(case)


def restart_case() -> None:
    def case() -> None:
        import tensorflow as tf
        from tensorflow.python.eager import context

        spec, procs, start = _cluster(2)
        try:
            strategy = _strategy(spec)
            coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
            with strategy.scope():
                anchors = [tf.Variable(0, name=f"anchor{i}") for i in range(2)]
                with strategy.extended.colocate_vars_with(anchors[0]):
                    v0 = tf.Variable(tf.ones([4]), name="v0")
                with strategy.extended.colocate_vars_with(anchors[1]):
                    v1 = tf.Variable(tf.ones([4]), name="v1")

            @tf.function
            def step():
                v0.assign_add(tf.ones([4]))
                v1.assign_add(tf.ones([4]))
                return v0.read_value()[0]

            for _ in range(3):
                coordinator.schedule(step)
            coordinator.join()
            assert list(v0.numpy()) == [4.0] * 4 and list(v1.numpy()) == [4.0] * 4
            procs[("ps", 1)].kill()
            procs[("ps", 1)].wait()
            try:
                coordinator.schedule(step)
                coordinator.join()
                raise AssertionError("a step after a PS died did not fail")
            except tf.errors.UnavailableError:
                pass
            start("ps", 1)  # the same address
            survivor = v0.numpy()
            assert survivor[0] >= 4.0  # the survivor kept its state (and maybe the cut step's update)
            try:
                v1.numpy()
                raise AssertionError("a variable of the restarted PS was still readable")
            except tf.errors.AbortedError as exc:
                assert "context_id" in str(exc), exc
            context.context().update_server_def(context.context()._server_def)
            assert list(v0.numpy()) == list(survivor)  # its handle still works after the update
            try:
                v1.assign(tf.zeros([4]))
                raise AssertionError("a variable of the restarted PS was usable after update_server_def")
            except tf.errors.InvalidArgumentError as exc:
                assert "invalid device" in str(exc), exc
        finally:
            for proc in procs.values():
                proc.kill()

    exit_with(case)


def moved_case() -> None:
    """A PS restarted at a new address: the coordinator reaches it after update_server_def, a survivor PS
    does not (it keeps the cluster its server started with), so a step moving a tensor PS to PS fails."""

    def case() -> None:
        import tensorflow as tf
        from tensorflow.python.eager import context

        spec, procs, start = _cluster(2)
        try:
            strategy = _strategy(spec)
            coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
            with strategy.scope():
                anchors = [tf.Variable(0, name=f"anchor{i}") for i in range(2)]
                with strategy.extended.colocate_vars_with(anchors[1]):
                    y = tf.Variable(tf.zeros([4]), name="y")

            def step_from(x):
                @tf.function
                def step():
                    with tf.device("/job:ps/task:1"):  # PS 1 pulls x's value from PS 0
                        y.assign(tf.fill([4], tf.cast(x.read_value(), tf.float32) * 2.0))
                    return y.read_value()[0]
                return step

            coordinator.schedule(step_from(anchors[0]))
            coordinator.join()
            procs[("ps", 0)].kill()
            procs[("ps", 0)].wait()
            spec["ps"][0] = f"localhost:{_port()}"
            start("ps", 0)  # at a new address, with the new cluster
            server_def = context.get_server_def()
            for job in server_def.cluster.job:
                if job.name == "ps":
                    job.tasks[0] = spec["ps"][0]
            context.context().update_server_def(server_def)
            with strategy.scope():
                fresh = [tf.Variable(7.0, name=f"fresh{i}") for i in range(2)]
            moved = next(v for v in fresh if tf.DeviceSpec.from_string(v.device).task == 0)
            assert float(moved.numpy()) == 7.0  # the coordinator reaches the moved PS
            try:
                coordinator.schedule(step_from(moved))
                coordinator.join()
                raise AssertionError("a survivor PS reached a PS at its new address")
            except tf.errors.UnavailableError as exc:
                assert "/job:ps/replica:0/task:1" in str(exc), exc  # PS 1 failed to pull from PS 0
        finally:
            for proc in procs.values():
                proc.kill()

    exit_with(case)


def test_colocation_places_a_variable_and_its_keras_slots_on_the_chosen_ps(fresh_process):
    fresh_process("integration.test_pss_facts:placement_case", timeout=300)


def test_a_restarted_ps_keeps_the_survivors_usable_and_its_own_variables_dead(fresh_process):
    fresh_process("integration.test_pss_facts:restart_case", timeout=300)


def test_a_survivor_ps_cannot_reach_a_ps_moved_to_a_new_address(fresh_process):
    fresh_process("integration.test_pss_facts:moved_case", timeout=300)
