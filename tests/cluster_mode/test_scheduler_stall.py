"""A machine is lost when gmux-scheduler listened for lost_after seconds and heard nothing, not when the
scheduler's own loop was held that long (its machines' reports then wait unread in its socket)."""
import time

from gmux.cluster.scheduler.service import Options, Scheduler
from gmux.cluster.scheduler.state import Machine
from gmux.wire import keys


def _scheduler(tmp_path):
    keydir = str(tmp_path / "keys")
    keys.create(keydir, "scheduler")
    return Scheduler(str(tmp_path / "state"), keydir, Options(listen="tcp://127.0.0.1:*", lost_after=5.0))


def test_silence_while_the_scheduler_was_held_is_not_counted(tmp_path):
    s = _scheduler(tmp_path)
    try:
        now = time.time()
        s.machines = {m: Machine(m, [{"index": 0, "mem_total": 1 << 30}], "tcp://127.0.0.1:1", last_seen=now - 15)
                      for m in ("m1", "m2")}
        s._listened_at = now - 15          # the loop's last turn was 15 s ago: it was held, not listening
        s._between_polls()
        assert {m.state for m in s.machines.values()} == {"up"}
        assert not [d for d in s.recent if d["kind"] == "lost"]
        # Listening from now on, a machine that stays silent is lost lost_after later, as ever.
        s.machines["m1"].last_seen = s._listened_at - 6.0
        s._last_tick = 0.0
        s._between_polls()
        assert s.machines["m1"].state == "lost" and s.machines["m2"].state == "up"
    finally:
        s.close()
