"""A child process that leads through the store's lease and writes fenced with its epoch.

Run as `python -m tests.support.lease_writer DSN HOLDER LEASE_S`. It renews (or tries to take)
the lease every third of LEASE_S, as a leader does, and in between, while it believes it leads,
writes an answer `HOLDER-EPOCH-N` fenced with its epoch every ROUND_S and prints
`wrote HOLDER-EPOCH-N`; when not leading it prints `follower EPOCH HOLDER`; a write refused by
the fence prints `fenced EPOCH` (and it asks for the lease again at once). The leadership test
pauses it with SIGSTOP past its lease and checks it writes nothing once resumed.
"""

from __future__ import annotations

import signal
import sys
import time

from fleet_svc.store.base import NotLeader, StoreUnavailable
from fleet_svc.store.postgres import PostgresStore

ROUND_S = 0.02


def main(argv: list[str]) -> int:
    """Lead and write until killed."""
    dsn, holder, lease_s = argv[0], argv[1], float(argv[2])
    store = PostgresStore(dsn)
    print("ready", flush=True)
    n = 0
    leading = False
    epoch = 0
    renew_at = 0.0
    resumed = [False]
    # Resumed from a pause (SIGCONT), a leader acts on what it last knew (its lease) before its
    # renewal: the next step is a write, which is what the fence is for. Without the flag a
    # pause landing between a write and the renewal check would renew first and never write.
    signal.signal(signal.SIGCONT, lambda *_: resumed.__setitem__(0, True))
    while True:
        try:
            if leading:
                n += 1
                key = f"{holder}-{epoch}-{n}"
                store.put_answer(key, "Lead", str(time.time()).encode())
                print(f"wrote {key}", flush=True)
            if resumed[0] and leading:
                resumed[0] = False
                continue  # write again before any renewal
            resumed[0] = False
            if time.monotonic() >= renew_at:
                lease = store.acquire_lease(holder, f"{holder}.example:50052", lease_s)
                renew_at = time.monotonic() + lease_s / 3
                leading, epoch = lease.mine, lease.epoch
                store.fence(lease.epoch if lease.mine else None)
                if not lease.mine:
                    print(f"follower {lease.epoch} {lease.holder}", flush=True)
        except NotLeader as exc:
            print(f"fenced {exc.epoch}", flush=True)
            leading, renew_at = False, 0.0
        except StoreUnavailable as exc:
            print(f"unavailable {exc.problem}", flush=True)
        time.sleep(ROUND_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
