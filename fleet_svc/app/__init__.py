"""The fleet's application layer: every change of the catalog and of what runs, each guarded
in one place (the model is there, not declared, at the caller's etag and not rolling out;
a request id is answered once). Servicers convert messages and call it; it sees no protos.

It hands over to the controller through the store only: a change commits its revision, its
rollout (PENDING) or its request to cancel one, and the request id's answer in one
transaction, then wakes the controller, which takes them up from the store on its tick. No
controller memory is written here, so a change whose commit fails can never run."""

from fleet_svc.app.changes import FleetApp
from fleet_svc.app.guarded import GuardedApp
from fleet_svc.app.values import ADOPT_WAIT_S, TRAFFIC_KEPT_S, Applied, ChangeOptions, View

__all__ = [
    "ADOPT_WAIT_S",
    "TRAFFIC_KEPT_S",
    "Applied",
    "ChangeOptions",
    "FleetApp",
    "GuardedApp",
    "View",
]
