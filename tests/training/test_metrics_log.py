"""A run's metrics: metrics.jsonl, and the same scalars as TensorBoard event files."""

import glob
import struct

import pytest

from specjax.training.metrics_log import MetricsLog


def read_events(folder: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} of the TFRecord event files in `folder` (8-byte length, its CRC,
    the Event proto, its CRC)."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(f"{folder}/events.out.tfevents.*")):
        with open(path, "rb") as f:
            data = f.read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_records_reach_metrics_jsonl_and_tensorboard(tmp_path):
    """Catches per-exit scalars missing from TensorBoard (nested dicts and per-exit lists
    flattened wrongly, e.g. exits numbered from 0) and records logged to one place only."""
    log = MetricsLog(str(tmp_path))
    train = {"split": "train", "step": 10, "loss": 2.5, "exit_ce": {"1": 3.0, "4": 2.4}}
    evaluation = {"split": "eval", "step": 10, "exit_agreement": [0.8, 1.0], "final_loss": 2.2}
    log.write(train)
    log.write(evaluation)
    log.close()  # the trainer closes its log when a run ends, however it ends
    assert log.read() == [train, evaluation]
    events = read_events(str(tmp_path / "tensorboard"))
    assert events == {"train/loss": [(10, 2.5)], "train/exit_ce/1": [(10, 3.0)],
                      "train/exit_ce/4": [(10, pytest.approx(2.4))],
                      "eval/exit_agreement/1": [(10, pytest.approx(0.8))],
                      "eval/exit_agreement/2": [(10, 1.0)],
                      "eval/final_loss": [(10, pytest.approx(2.2))]}


def test_a_reading_process_writes_nothing(tmp_path):
    """Catches a second process of a multi-process run writing metrics or events."""
    MetricsLog(str(tmp_path), writable=False).write({"split": "train", "step": 1, "loss": 1.0})
    assert list(tmp_path.iterdir()) == []
