"""Appends one JSON object per line to workdir/metrics.jsonl."""

import json
import os
from typing import Any


class MetricsLog:
    """`writable=False` (every process of a multi-process run but the first): reads only."""

    def __init__(self, workdir: str, writable: bool = True):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.writable = writable

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

    def read(self) -> list[dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True) + "\n"
