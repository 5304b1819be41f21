"""Run records: the versioned schema, JSONL/CSV sinks and the sweep merge callback."""

from lcab.records.schema import SCHEMA_VERSION, STATUSES, PassResult, RunRecord
from lcab.records.sinks import JsonlSink, merge_records, read_records, write_csv

__all__ = [
    "SCHEMA_VERSION",
    "STATUSES",
    "JsonlSink",
    "PassResult",
    "RunRecord",
    "merge_records",
    "read_records",
    "write_csv",
]
