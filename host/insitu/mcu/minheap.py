"""The smallest heap a compiled training program runs in, found on the twin by bisection.

Each probe powers on the twin with a heap of H bytes (the Cortex-M7 twin cuts its heap to H at
boot, the unix port takes ``-X heapsize=H``) on the same flash (the firmware and
the compiled model flashed once), starts the training firmware, trains a few samples and
evaluates one. A heap is enough when all of that answers; the firmware refuses a plan that does
not fit (MSG_ERROR), and a MemoryError elsewhere silences it (a timeout).
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass

import numpy as np

from insitu.errors import InsituError
from insitu.mcu.device import DeviceError, TrainingDevice
from insitu.mcu.link import FirmwareCrashed, LinkError

GRANULE = 512          # bisection stops when the bracket is this narrow (bytes)


@dataclass
class Probe:
    heap_bytes: int
    ok: bool
    peak: int | None
    why: str = ""


def probe(flash_dir: str, heap_bytes: int, x_codes: np.ndarray, labels: np.ndarray, board: str,
          timeout_s: float = 10.0, twin: str = "qemu") -> Probe:
    from insitu.mcu.twin import McuTwin

    with McuTwin(flash_dir, heap_bytes=heap_bytes, board=board, twin=twin) as running:
        assert running.port is not None             # started by the with
        dev = TrainingDevice(running.port, timeout_s=timeout_s)
        try:
            info = dev.start()
            dev.set_checkpoint_every(1 << 30)       # probes must not leave a checkpoint behind
            start = int(info["done"])
            for n, (x, y) in enumerate(zip(x_codes, labels)):
                dev.train(start + n, int(y), x)
            dev.predict(0, x_codes[0])
            peak = dev.stats().get("mem_peak")
            return Probe(heap_bytes, True, peak)
        except DeviceError as exc:
            return Probe(heap_bytes, False, None, str(exc))
        except LinkError as exc:
            return Probe(heap_bytes, False, None, f"no answer ({exc.__class__.__name__})")
        except FirmwareCrashed as exc:
            if "MemoryError" not in str(exc):
                raise
            return Probe(heap_bytes, False, None, "MemoryError")
        finally:
            dev.close()


def find_min_heap(files: dict, x_codes: np.ndarray, labels: np.ndarray, low: int, high: int,
                  board: str = "stm32f746-disco-sim", log=lambda p: None,
                  twin: str = "qemu", flash_dir: str | None = None) -> tuple[int, list[Probe]]:
    """Bisection over the heap size in [low, high]; returns (smallest heap that works, probes).
    ``flash_dir``: the twin's flash folder (default: a temporary one); a folder flashed before
    keeps the files that have not changed (one runtime for several programs)."""
    from insitu.mcu.flash import flash
    from insitu.mcu.twin import McuTwin

    probes: list[Probe] = []
    with contextlib.nullcontext(flash_dir) if flash_dir else \
            tempfile.TemporaryDirectory(prefix="insitu-minheap-") as flash_dir:
        with McuTwin(flash_dir, heap_bytes=max(high, 256 * 1024), board=board, twin=twin) as board_twin:
            assert board_twin.port is not None      # started by the with
            flash(board_twin.port, files)

        def run(h):
            p = probe(flash_dir, h, x_codes, labels, board, twin=twin)
            probes.append(p)
            log(p)
            return p.ok

        if not run(high):
            raise InsituError(f"the program does not train even with a {high:,} B heap "
                              f"({probes[-1].why}); check it with `insitu train --algo sparse --heap`")
        while high - low > GRANULE:
            mid = (low + high) // 2 // 16 * 16
            if run(mid):
                high = mid
            else:
                low = mid
    return high, probes
