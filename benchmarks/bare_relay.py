"""The floor under benchmark (c): the same message path with no gmux in it.

    python benchmarks/bare_relay.py relay ENDPOINT
    python benchmarks/bare_relay.py job ENDPOINT SCRIPT [ARGS...]

A client's request goes to a relay (a ROUTER, as gmuxd is), from the relay to a training job (a DEALER polled
without blocking at every optimizer step, as gmux's agent is), and the job's answer comes back the same way.
There is no validation, no state and no suspend: the job answers at its first boundary after the request
arrives. What is left is the wait for that boundary and four ZeroMQ hops between processes, which is what any
multiplexer that stops jobs at mini-batch boundaries must pay; benchmarks/multiplex.py measures it in the same
run as gmux's own command latency.
"""
from __future__ import annotations

import runpy
import sys

import zmq


def relay(endpoint: str) -> None:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(endpoint)
    job = None
    while True:
        frames = sock.recv_multipart()
        sender, body = frames[0], frames[1:]
        if body == [b"hello"]:
            job = sender
        elif sender == job:                       # [client, payload]: the answer goes back to the client
            sock.send_multipart(body)
        elif job is None:
            sock.send_multipart([sender, b"no job yet"])
        else:
            sock.send_multipart([job, sender, *body])


def job(endpoint: str, script: str, argv: list[str]) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(b"hello")

    def at_boundary(optimizer, args, kwargs):
        if sock.poll(0):
            while True:
                try:
                    request = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return
                sock.send_multipart(request)

    register_optimizer_step_post_hook(at_boundary)
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "relay":
        relay(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "job":
        job(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)
