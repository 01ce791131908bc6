"""Two gmuxd given the same machine name (and key): the first keeps the machine, the second is refused and says
so in its log, and the scheduler says so once; the second takes over only once the first has gone silent (as a
restarted gmuxd does). Before, each took the name from the other at every reconnect and the scheduler's view of
the machine's jobs flipped between the two."""
import signal
import subprocess
import time

from cluster_harness import PY, ROOT, env, wait_for


def test_a_second_gmuxd_with_a_machines_name_is_refused_until_the_first_is_gone(cluster_factory, tmp_path):
    c = cluster_factory(policy="gandiva", machines=("m1",))
    c.wait_machines(1)
    log = tmp_path / "gmuxd-impostor.log"
    with open(log, "ab") as out:
        second = subprocess.Popen([PY, "-m", "gmux.cli.gmuxd", "--runtime-dir", str(tmp_path / "rt-impostor"),
                                   "--virtual-gpus", "3x1GiB", "--quantum", "2", "--scheduler", c.endpoint,
                                   "--keys", c.keys, "--name", "m1", "--warm-starts", "0"],
                                  env=env(), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        refused = "scheduler refused: machine m1 is spoken for by another gmuxd, which still reports"
        wait_for(lambda: refused in log.read_text(), 30, lambda: log.read_text())
        for _ in range(6):        # the first keeps the machine: its 2 GPUs, not the second's 3
            ps = c.ps()
            assert [(m["name"], m["gpus"]) for m in ps["machines"]] == [("m1", 2)], ps["machines"]
            time.sleep(0.5)
        texts = [d["text"] for d in c.ps()["decisions"]]
        assert sum("a second gmuxd claims machine m1" in t for t in texts) == 1, texts
        assert log.read_text().count("scheduler refused") == 1
        # A job submitted now runs under the first.
        script = tmp_path / "short.py"
        script.write_text("import time\ntime.sleep(1)\n")
        cjob = c.call("c_submit", argv=[PY, str(script)], cwd=ROOT, env={})["cjob"]
        wait_for(lambda: c.job(cjob)["state"] == "done", 60, lambda: c.job(cjob))
        assert (tmp_path / "rt-m1" / "logs" / f"{cjob}.cluster.log").exists()
        assert not (tmp_path / "rt-impostor" / "logs" / f"{cjob}.cluster.log").exists()
        # The first gone, the second speaks for the machine.
        c.daemons["m1"].send_signal(signal.SIGKILL)
        c.daemons["m1"].wait()
        wait_for(lambda: [m["gpus"] for m in c.ps()["machines"]] == [3], 30, lambda: c.ps()["machines"])
        assert any("machine m1: a new gmuxd speaks for it" in d["text"] for d in c.ps()["decisions"])
    finally:
        second.kill()
        second.wait()
