"""A child process that writes to a store and acknowledges each write on stdout.

Run as `python -m tests.support.store_writer STORE [COUNT]` (a SQLite path or a PostgreSQL
DSN). After each write returns it prints one line naming what was written and flushes, the
way the fleet answers a client only after the store accepted the write; the durability test
kills it with SIGKILL mid-stream and checks that every acknowledged write is in the database.

Lines: `model NAME REVISION`, `answer REQUEST_ID`, `replica ID RESTARTS`, `value KEY VALUE`.
"""

from __future__ import annotations

import sys

from fleet_svc.store.base import ModelRecord, ReplicaRecord
from fleet_svc.store.urls import open_store

# Few names, so models get many revisions and replicas are replaced, not only inserted.
MODEL_NAMES = 7
REPLICA_IDS = 5


def answer_bytes(i: int) -> bytes:
    """The answer stored for request `req-{i}`, so the reader can check its content."""
    return f"answer to request {i}".encode() * 4


def main(argv: list[str]) -> int:
    """Write models, answers, replicas and values until COUNT rounds are done or killed."""
    url = argv[0]
    count = int(argv[1]) if len(argv) > 1 else 1_000_000
    revisions: dict[str, int] = {}
    store = open_store(url)
    try:
        print("ready", flush=True)
        for i in range(count):
            name = f"m{i % MODEL_NAMES}"
            written = store.put_model(
                ModelRecord(
                    name=name,
                    revision=0,
                    spec={"name": name, "round": i},
                    updated_by="store_writer",
                    updated_at=float(i),
                ),
                expect_revision=revisions.get(name, 0),
            )
            revisions[name] = written.revision
            print(f"model {name} {written.revision}", flush=True)

            store.put_answer(f"req-{i}", "CreateModel", answer_bytes(i))
            print(f"answer req-{i}", flush=True)

            replica_id = f"rep-{i % REPLICA_IDS}"
            store.put_replica(
                ReplicaRecord(
                    id=replica_id,
                    model=name,
                    profile="cpu",
                    revision=written.revision,
                    gpus=(i % 8,),
                    phase="READY",
                    restarts=i,
                    spec={"round": i},
                )
            )
            print(f"replica {replica_id} {i}", flush=True)

            store.put_value("round", str(i))
            print(f"value round {i}", flush=True)
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
