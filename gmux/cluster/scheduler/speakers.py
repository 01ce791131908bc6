"""One gmuxd speaks for a machine: a link's routing id is NAME/BOOT, new at each start of gmuxd, so the scheduler
tells a restarted gmuxd, and a second one given the same --name and key by mistake, from the one it has. A new
one takes the machine over once the one it had has been silent for `silence_s` (a restart: shorter than the time
to count a machine lost, whose jobs would then start elsewhere); while that one still reports, the newcomer is
refused, or the two would answer for each other's jobs and the scheduler's view of the machine would flip between
them at every reconnect."""
from __future__ import annotations

from typing import Optional

from gmux.cluster.scheduler.state import Machine

ACCEPT, TAKE_OVER, REFUSE = "accept", "take over", "refuse"


def routing_name(ident: bytes, name: str) -> Optional[str]:
    """The routing id as text if it is the link of the machine named by its key (NAME or NAME/BOOT), else None."""
    who = ident.decode(errors="replace")
    return who if who == name or who.startswith(name + "/") else None


def speaker(m: Machine, who: str, now: float, silence_s: float) -> str:
    if who == m.ident or not m.ident:
        return ACCEPT
    if m.state == "up" and now - m.last_seen < silence_s:
        return REFUSE
    return TAKE_OVER


REFUSAL = ("machine {name} is spoken for by another gmuxd, which still reports: if that is this machine's previous "
           "gmuxd, this one takes over once it has been silent for {silence:g} s; if not, give this one its own "
           "--name and daemon key")
