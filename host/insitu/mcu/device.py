"""The host's side of the training firmware (firmware/fw_train.py) over the serial link.

:class:`TrainingDevice` speaks the firmware's messages (their numbers are read from
``fw_train.py`` itself, so the two cannot drift): start the firmware from the REPL, ask what it
has done, send training and evaluation samples, read its memory statistics, make it checkpoint.
A dropped link is reopened and the firmware asked where it stands; a device that was reset is
restarted and resumes from its last checkpoint, so no sample is lost or trained twice.
"""

from __future__ import annotations

import struct
import time

import numpy as np

from insitu.errors import InsituError
from insitu.mcu.link import DeviceLink, FirmwareStopped, LinkError, firmware_literals

START = "import fw_train; fw_train.serve()"


#: The firmware's message types, read from its source.
MSG = {k: v for k, v in firmware_literals("fw_train.py").items() if k.startswith("MSG_")}


class DeviceError(InsituError):
    """The firmware reported an error (its message is the text)."""


def _parse_kv(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split() if "=" in item)


class TrainingDevice:
    #: The most input bytes a sample's frame carries (None: what the link's frames hold); a
    #: larger input goes ahead in MSG_INPUT parts of this size at most.
    input_part_bytes: int | None = None

    def __init__(self, port: str, timeout_s: float = 30.0, reconnect_s: float = 30.0):
        self.port, self.timeout_s, self.reconnect_s = port, timeout_s, reconnect_s
        self.link: DeviceLink | None = None
        self.reconnects = 0
        self.restarts = 0
        self.step_k: int | None = None      # the last training step's count (see train)

    # ------------------------------------------------------------------ session

    def start(self) -> dict:
        """Start the firmware (from the REPL) and return its HELLO info."""
        # On the link's own port, kept open: a traceback of the firmware failing at import comes
        # out as FirmwareCrashed instead of a silent timeout.
        self.close()
        self.link = DeviceLink(self.port, timeout_s=self.timeout_s)
        self.link.start_program(START)
        return self.hello()

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None

    def _request(self, typ: str, payload: bytes, reply: tuple[str, ...]):
        if self.link is None:
            raise LinkError(f"no link to {self.port}: start() the device first")
        frame = self.link.request(MSG[typ], payload, tuple(MSG[r] for r in reply) + (MSG["MSG_ERROR"],))
        if frame.type == MSG["MSG_ERROR"]:
            raise DeviceError(f"the device says: {bytes(frame.payload).decode(errors='replace')}")
        return frame

    def hello(self) -> dict:
        info = _parse_kv(bytes(self._request("MSG_HELLO", b"", ("MSG_INFO",)).payload).decode())
        return {k: (int(v) if v.lstrip("-").isdigit() else v) for k, v in info.items()}

    def stats(self) -> dict:
        text = bytes(self._request("MSG_STATS", b"", ("MSG_STATS",)).payload).decode()
        return {k: (int(v) if v.lstrip("-").isdigit() else v) for k, v in _parse_kv(text).items()}

    def set_checkpoint_every(self, n: int) -> None:
        self._request("MSG_SET", struct.pack("<I", n), ("MSG_ACK",))

    def save(self) -> int:
        return struct.unpack_from("<I", bytes(self._request("MSG_SAVE", b"", ("MSG_ACK",)).payload), 4)[0]

    def bye(self) -> None:
        self._request("MSG_BYE", b"", ("MSG_ACK",))
        self.close()

    # ------------------------------------------------------------------ samples

    def _with_input(self, head: bytes, codes: np.ndarray) -> bytes:
        """The payload of a sample: ``head`` and its input codes, or, for an input larger than
        a frame, ``head`` alone after the input went ahead in MSG_INPUT parts."""
        if self.link is None:
            raise LinkError(f"no link to {self.port}: start() the device first")
        data = np.asarray(codes, np.int8).tobytes()
        room = self.link.max_payload
        step = min(room - 4, self.input_part_bytes or room)
        if len(head) + len(data) <= room and len(data) <= step:
            return head + data
        for at in range(0, len(data), step):
            frame = self._request("MSG_INPUT", struct.pack("<I", at) + data[at:at + step], ("MSG_ACK",))
            if struct.unpack_from("<I", bytes(frame.payload))[0] != min(len(data), at + step):
                raise LinkError(f"{self.port}: the device did not take input bytes {at}..{at + step}")
        return head

    def train(self, number: int, label: int, codes: np.ndarray) -> tuple[int, int, int]:
        """Train sample ``number``; returns ``(samples done, predicted, p(label) code)``.
        A sample the device has already trained is acknowledged, not trained again."""
        payload = self._with_input(struct.pack("<IB", number, label), codes)
        frame = self._request("MSG_TRAIN", payload, ("MSG_ACK",))
        reply = bytes(frame.payload)
        n, done, predicted, p_label = struct.unpack_from("<IIii", reply)
        # the step's count on the device, in thousands (instructions on the twin, cycles on a board)
        self.step_k = struct.unpack_from("<I", reply, 16)[0] if len(reply) >= 20 else None
        return done, predicted, p_label

    def predict(self, tag: int, codes: np.ndarray) -> int:
        payload = self._with_input(struct.pack("<I", tag), codes)
        frame = self._request("MSG_EVAL", payload, ("MSG_PRED",))
        got, predicted = struct.unpack("<Ii", bytes(frame.payload))
        if got != tag:
            raise LinkError(f"{self.port}: a prediction for sample {got} came back for sample {tag}")
        return predicted

    def predict_all(self, x_codes: np.ndarray) -> np.ndarray:
        return np.array([self.with_recovery(lambda i=i: self.predict(i, x_codes[i])) for i in range(len(x_codes))])

    # ------------------------------------------------------------------ recovery

    def with_recovery(self, action):
        """Run ``action``; on a dropped link reopen it, on a reset device restart the firmware
        (which restores its checkpoint), then run ``action`` again."""
        deadline = None
        while True:
            try:
                return action()
            except LinkError as exc:
                deadline = deadline or time.monotonic() + self.reconnect_s
                if time.monotonic() > deadline:
                    raise LinkError(f"{self.port}: the device did not come back within {self.reconnect_s:.0f} s "
                                    f"({exc})") from None
                self._recover(at_prompt=isinstance(exc, FirmwareStopped))

    def _recover(self, at_prompt: bool = False) -> None:
        time.sleep(0.2)
        self.close()
        if not at_prompt:                       # not seen at its REPL: maybe only the link dropped
            try:
                self.link = DeviceLink(self.port, timeout_s=min(self.timeout_s, 3.0))
                self.hello()                    # the firmware is still serving
                self.link.timeout_s = self.timeout_s
                self.reconnects += 1
                return
            except (LinkError, OSError):
                self.close()
        try:                                    # the device was reset: restart the firmware
            self.start()
            self.restarts += 1
        except (LinkError, OSError):
            pass                                # with_recovery tries again until its deadline
