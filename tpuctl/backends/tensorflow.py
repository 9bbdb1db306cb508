"""The ``tensorflow`` backend: local TPU core ids the way DTensor reads them.

TensorFlow is imported inside the call (about 3-5 s). With no TPU, ``tf.config.list_physical_devices("TPU")``
is empty and this raises NoTpuError at once. With TPUs it runs what ``tpu_util.tpu_system_init_helper``
runs first: the ``ConfigureAndInitializeGlobalTPU`` op on this host's ``TPU_SYSTEM`` device, which returns
the local core ids in device-ordinal order, doubled under megacore as DTensor does.

Limitation: that path needs a TPU VM with a TPU-enabled TensorFlow and has not been run on hardware by the
test suite (CI machines have none); the no-TPU path is tested for real. The op initializes the TPU system
in this process, so call it from a short-lived process before the job starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuctl.errors import NoTpuError
from tpuctl.tpu.slice import TpuSlice

NO_TPU_HINT = "run tpuctl init on a TPU VM with a TPU build of TensorFlow, or set `backend: sim` in the spec"


@dataclass(frozen=True)
class TensorFlowBackend:
    slice: TpuSlice
    name = "tensorflow"  # as --backend spells it (a class attribute, not a field)

    def local_core_ids(self, task: int) -> list[int]:
        import tensorflow as tf

        found = tf.config.list_physical_devices("TPU")
        if not found:
            kinds = sorted({d.device_type for d in tf.config.list_physical_devices()})
            raise NoTpuError(
                "no TPU found on this host (backend tensorflow): "
                f"tf.config.list_physical_devices('TPU') is empty (devices: {', '.join(kinds) or 'none'})",
                hint=NO_TPU_HINT,
            )
        return _dtensor_local_core_ids(tf, self.slice.megacore)


def _dtensor_local_core_ids(tf: Any, megacore: bool) -> list[int]:  # pragma: no cover - needs a TPU
    from tensorflow.dtensor.python import tpu_util
    from tensorflow.python.eager import context

    use_tfrt = bool(context.context().use_tfrt)

    @tf.function  # type: ignore[untyped-decorator]
    def init() -> Any:
        return tpu_util.gen_dtensor_ops.configure_and_initialize_global_tpu(use_tfrt_host_runtime=use_tfrt)

    # Local mode: tpuctl runs no TF cluster, so this host's TPU_SYSTEM is under job "localhost".
    with tf.device("/job:localhost/replica:0/task:0/device:TPU_SYSTEM:0"):
        try:
            ids = init()
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as exc:
            said = exc.message.strip().splitlines()[0]
            raise NoTpuError(f"no TPU found on this host (backend tensorflow): {said}", hint=NO_TPU_HINT) from exc
    values = [int(i) for i in ids.numpy()]
    return [2 * i for i in values] if megacore else values  # the runtime numbers megacore chips; DTensor doubles
