"""The fleet's controller: the one writer of fleet state, ticking snapshot -> plan -> dispatch.

`core` holds the state, the loop and the tick; `writes` the one place replicas change;
`agent_events` what agents report. fleet_svc.controller.core says where the store is called."""

from fleet_svc.controller.core import ADOPT_POLL_S, FLUSH_ROUNDS, MAX_BURST, Controller
from fleet_svc.controller.writes import AgentLink, FleetState

__all__ = ["ADOPT_POLL_S", "FLUSH_ROUNDS", "MAX_BURST", "AgentLink", "Controller", "FleetState"]
