"""The team's job queue's table, `job_queue` (daemon/postgres/jobqueue.py says what it holds and who
writes what of it): its schema, and its rows made for the jobs a database held before it had one.

Rule kept here: a leaf of the postgres package beside rows.py (the store creates the schema from
here, and jobqueue.py decides on the rows), so neither imports the other in a circle.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..jobs.state import AcceptJob, JobRecord, PutJob

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS job_queue (id bytea PRIMARY KEY, key bytea NOT NULL, kind text NOT NULL,"
    " state text NOT NULL, attempts integer NOT NULL, created bigint NOT NULL, lane bytea, node text,"
    " token text, lease_until timestamptz, not_before timestamptz)",
    "CREATE INDEX IF NOT EXISTS job_queue_active ON job_queue (created) WHERE state IN ('queued', 'running')",
    "CREATE INDEX IF NOT EXISTS job_queue_key ON job_queue (key, created)",
    "CREATE INDEX IF NOT EXISTS job_queue_created ON job_queue (created)",
    "CREATE INDEX IF NOT EXISTS job_queue_lane ON job_queue (lane, state) WHERE lane IS NOT NULL",
]

decoder = msgspec.msgpack.Decoder(AcceptJob | PutJob)  # the bodies of the `jobs` table


def key_bytes(text: str) -> bytes:
    """An id or key as the tables hold it (rows.py's keys: UTF-8, any character)."""
    return text.encode("utf-8", "surrogatepass")


def fill_job_queue(conn: Any) -> None:
    """Migration to schema 3: a job_queue row for every job stored before (queue order: its accept's seq)."""
    rows = conn.execute("SELECT id, slot, seq, body FROM jobs ORDER BY seq, pos").fetchall()
    created: dict[bytes, int] = {}
    records: dict[bytes, JobRecord] = {}
    for job_id, slot, seq, body in rows:
        mutation = decoder.decode(bytes(body))
        if bytes(slot) == b"accept":
            created[bytes(job_id)] = seq
        records[bytes(job_id)] = mutation.job
    for job_id, record in records.items():
        conn.execute(
            "INSERT INTO job_queue (id, key, kind, state, attempts, created) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (id) DO NOTHING",
            (job_id, key_bytes(record.key), record.kind, record.state, record.attempts, created.get(job_id, 0)),
        )
