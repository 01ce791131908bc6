"""Who may act on which job: the per-user daemon's admin token, or a system daemon's kernel-given uids.

A per-user daemon (the default) serves one user: a request is that user's if it carries the admin token, which
only that user can read (mode 0600 in the private runtime directory).

A system daemon (gmuxd --system, run by root) serves every member of its socket group through one socket. Who
asks is what the kernel says about the ipc peer (gmux.wire.server.Caller: uid, gid, pid), never anything the
peer sends or can read: a user may act on the jobs they own (the uid that submitted or registered them); an
admin (root, or a member of --admin-group in the user database) on every job. A job's process runs as its user
and so has that user's rights over their own jobs, and nothing over anyone else's; there is no token a job could
read to become an admin.
"""
from __future__ import annotations

import grp
import hmac
import os
import pwd
import time
from dataclasses import dataclass
from typing import Callable, Optional

from gmux import protocol
from gmux.wire.server import Caller, Refused, Request


@dataclass(frozen=True)
class SystemMode:
    """How a system daemon admits users: the group that may reach its socket, and the group of its admins."""
    socket_group: int
    admin_group: Optional[int] = None


LOOKUP_TTL_S = 60.0    # how long an answer of the user database is reused


def _cached(fn: Callable) -> Callable:
    """`fn` with its answers kept LOOKUP_TTL_S: the user database may be a network service (LDAP, sssd) that takes
    milliseconds or more, and gmuxd's one loop asks it for every request of a user and every row of a ps; a
    change of membership takes effect within the minute."""
    memo: dict = {}

    def lookup(*key):
        now = time.monotonic()
        hit = memo.get(key)
        if hit is None or now - hit[0] > LOOKUP_TTL_S:
            if len(memo) > 4096:
                memo.clear()
            hit = memo[key] = (now, fn(*key))
        return hit[1]
    return lookup


@_cached
def user_name(uid: Optional[int]) -> str:
    if uid is None:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def group_name(gid: Optional[int]) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except (KeyError, TypeError):
        return f"gid {gid}"


@_cached
def user_groups(uid: int, gid: int) -> list[int]:
    """The user's groups as the user database has them (what a login of theirs would get: initgroups)."""
    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        return [gid]


@_cached
def member_of(uid: int, group: int) -> bool:
    """Whether the user database has the user in the group now: a process keeps the groups it started with (a
    user removed from a group keeps it in every process they had), and its gid may be any group it ever held."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return False
    return group in os.getgrouplist(pw.pw_name, pw.pw_gid)


class Access:
    def __init__(self, admin_token: Optional[str], token_file: str, system: Optional[SystemMode] = None):
        self.token, self.token_file, self.system = admin_token, token_file, system

    def caller(self, req: Request) -> Caller:
        """The requester: in a per-user daemon, after checking its admin token; in a system daemon, as the
        kernel says (the server refuses a request it cannot attribute)."""
        msg = req.msg
        if self.system is None:
            if not hmac.compare_digest(self.token or "", msg["admin"]):
                raise Refused(f"{msg.type}: wrong admin token (read it from {self.token_file})")
            return req.caller or Caller(os.getuid(), os.getgid(), 0)
        assert req.caller is not None   # Server(credentials=True) refuses a request without one
        self.served(msg, req.caller)
        return req.caller

    def served(self, msg: protocol.Message, who: Caller) -> None:
        """Refuses a system daemon's user who is no longer a member of its socket group (the socket let them in
        with the groups a process of theirs started with): what they may do ends within LOOKUP_TTL_S."""
        if self.system is not None and who.uid != 0 and not member_of(who.uid, self.system.socket_group):
            raise Refused(f"{msg.type}: {user_name(who.uid)} is not a member of group "
                          f"{group_name(self.system.socket_group)}, whose members this gmuxd serves (a process "
                          f"started while they were keeps the group, not the right)")

    def is_admin(self, who: Caller) -> bool:
        if self.system is None or who.uid == 0:
            return True
        admins = self.system.admin_group
        return admins is not None and member_of(who.uid, admins)

    def admins(self) -> str:
        """Who the admins are, in words (for refusals)."""
        group = self.system.admin_group if self.system else None
        return "root" + (f" and members of group {group_name(group)}" if group is not None else "")

    def may_act(self, who: Caller, owner: Optional[int]) -> bool:
        return self.is_admin(who) or owner == who.uid

    def check(self, msg: protocol.Message, who: Caller, jobs: list) -> None:
        """Refuses, naming the owner, a request about jobs (a job, or a gang's ranks) that are not all the
        caller's, unless the caller is an admin."""
        if self.is_admin(who):
            return
        for job in jobs:
            if job.uid != who.uid:
                raise Refused(f"{msg.type}: job {job.id} belongs to {user_name(job.uid)}, not to you "
                              f"({user_name(who.uid)}); you may act only on your own jobs (admins: {self.admins()})")

    def admin_only(self, msg: protocol.Message, who: Caller) -> None:
        if not self.is_admin(who):
            raise Refused(f"{msg.type}: only an admin of this gmuxd ({self.admins()}) may do that; you are "
                          f"{user_name(who.uid)}")
