"""Appends one JSON object per line to workdir/metrics.jsonl."""

import json
import os
from typing import Any


class MetricsLog:
    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, "metrics.jsonl")

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
