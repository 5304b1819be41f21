"""Read an offline W&B run (``run-<id>.wandb``): wandb has no public reader for these files.

The file is a LevelDB-style log — a 7-byte W&B header, then 32 KiB blocks of chunks, each with a
7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) — whose payloads are
``wandb_internal_pb2.Record`` protobufs. `OfflineRun` gathers what the tests check.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
CHUNK_HEADER = 7


def records(path: Path) -> Iterator[Any]:
    """Every protobuf record of an offline run file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    pos, pending = 7, b""
    while pos + CHUNK_HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < CHUNK_HEADER:  # block trailer too small for a header: skip to the next block
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        if length == 0 and kind == 0:  # zero padding up to the block end
            pos += room
            continue
        chunk = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 1:
            yield pb.Record.FromString(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pb.Record.FromString(pending + chunk)


def _items(items: Any) -> dict[str, Any]:
    out = {}
    for item in items:
        key = ".".join(item.nested_key) if item.nested_key else item.key
        out[key] = json.loads(item.value_json)
    return out


@dataclass
class OfflineRun:
    """What one offline run file holds."""

    run_id: str = ""
    name: str = ""
    group: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)
    """Metric name -> its step metric (``define_metric``)."""
    exit_code: int | None = None
    artifacts: dict[str, dict[str, str]] = field(default_factory=dict)
    """Artifact type -> {path in the artifact: local file it was logged from}."""

    @classmethod
    def read(cls, path: Path) -> OfflineRun:
        """Decode ``run-<id>.wandb``."""
        run = cls()
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.run_id, run.name = record.run.run_id, record.run.display_name
                run.group, run.tags = record.run.run_group, list(record.run.tags)
                run.config |= {i.key: json.loads(i.value_json) for i in record.run.config.update}
            elif kind == "config":
                run.config |= {i.key: json.loads(i.value_json) for i in record.config.update}
            elif kind == "history":
                run.history.append(_items(record.history.item))
            elif kind == "summary":
                run.summary |= _items(record.summary.update)
                for item in record.summary.remove:
                    run.summary.pop(
                        ".".join(item.nested_key) if item.nested_key else item.key, None
                    )
            elif kind == "metric":
                if record.metric.step_metric:
                    run.metrics[record.metric.name or record.metric.glob_name] = (
                        record.metric.step_metric
                    )
            elif kind == "artifact":
                run.artifacts[record.artifact.type] = {
                    entry.path: entry.local_path for entry in record.artifact.manifest.contents
                }
            elif kind == "exit":
                run.exit_code = record.exit.exit_code
        return run


def offline_runs(folder: Path) -> list[OfflineRun]:
    """Every offline run below ``folder`` (one file per run directory)."""
    return [OfflineRun.read(p) for p in sorted(folder.rglob("offline-run-*/run-*.wandb"))]
