"""Appends one JSON object per line to workdir/metrics.jsonl, and the same scalars to
TensorBoard event files in workdir/tensorboard when `tensorboardX` is installed (the
`tensorboard` extra): `tensorboard --logdir W/tensorboard`."""

import importlib.util
import json
import os
from collections.abc import Iterator
from typing import Any

TENSORBOARD = importlib.util.find_spec("tensorboardX") is not None  # the optional writer


class MetricsLog:
    """`writable=False` (every process of a multi-process run but the first): reads only."""

    def __init__(self, workdir: str, writable: bool = True):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.writable = writable
        self._events_dir = os.path.join(workdir, "tensorboard")
        self._events = None  # the TensorBoard writer, made on the first write

    def drop_after(self, step: int) -> int:
        """Removes records of steps after `step` (a run interrupted after its last checkpoint
        logged steps that the resumed run repeats); returns how many were removed. The file is
        replaced atomically."""
        records = self.read()
        kept = [r for r in records if r.get("step", 0) <= step]
        if len(kept) < len(records) and self.writable:
            partial = self.path + ".tmp"
            with open(partial, "w", encoding="utf-8") as f:
                f.writelines(map(_line, kept))
            os.replace(partial, self.path)
        return len(records) - len(kept)

    def write(self, record: dict[str, Any]) -> None:
        if not self.writable:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(_line(record))
        if self._events is None and TENSORBOARD:
            from tensorboardX import SummaryWriter

            self._events = SummaryWriter(self._events_dir)
        if self._events is not None:
            prefix = record.get("split", "train")
            for tag, value in scalars(record):
                self._events.add_scalar(f"{prefix}/{tag}", value, record.get("step", 0))
            self._events.flush()

    def close(self) -> None:
        """Writes out the TensorBoard events still queued (tensorboardX's flush leaves the
        newest one queued until the next write or the close)."""
        if self._events is not None:
            self._events.close()
            self._events = None

    def read(self) -> list[dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]


def scalars(record: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(tag, value) of every number in a record: nested dicts by key ("exit_ce/1"), lists of
    per-exit values by exit number ("exit_loss/1" for exit 1); split and step left out."""
    for key, value in sorted(record.items()):
        if key in ("split", "step"):
            continue
        tag = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from scalars(value, f"{tag}/")
        elif isinstance(value, list):
            yield from ((f"{tag}/{i}", float(v)) for i, v in enumerate(value, 1)
                        if isinstance(v, (int, float)))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield tag, float(value)


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True) + "\n"
