"""The torch.distributed rendezvous of a gang's ranks on one machine: a free loopback port and the environment
variables `init_method="env://"` reads."""
from __future__ import annotations

import socket
from typing import Optional


def free_port() -> int:
    """A loopback port free now (the ranks bind it when they start: another process could take it first, as
    with torchrun's own choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous_env(world: int, port: Optional[int] = None, rank: Optional[int] = None) -> dict:
    """Each rank sees only its own GPU (as device 0), so LOCAL_RANK is 0: the device index a script passes to
    torch.cuda.set_device."""
    env = {"WORLD_SIZE": str(world), "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port if port is not None else free_port())}
    if rank is not None:
        env["RANK"] = str(rank)
    return env
