"""gmuxd --system with real Unix users (throwaway ones, made here as root): one user cannot suspend, kill, see the
logs of, or list another's job; a user acts on their own; root and the admin group act on all; a job cannot act
as an admin with anything it can read; jobs run as their users. Who asks is the kernel's word (the ipc peer's
uid), never a file or a field.

Skipped unless run as root with useradd/groupadd (CI and these machines run the suite as root)."""
from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from gmux import protocol
from gmux.node.access import SystemMode
from gmux.rundir import RuntimeDir, RuntimeDirError
from node_harness import GiB, PY, ROOT, TRAIN, env, wait_for

TOOLS = ("useradd", "userdel", "groupadd", "groupdel")
CANNOT_MAKE_USERS = (None if os.geteuid() == 0 and all(shutil.which(t) for t in TOOLS) else
                     f"needs root and {', '.join(TOOLS)} to make throwaway users (running as uid {os.geteuid()})")

# Run as a user: requests to gmuxd through the ordinary client, each answered {ok, data | error}.
ASK = """
import json, sys
from gmux.wire.daemon_client import Client, GmuxError
out = []
for mtype, fields in json.loads(sys.argv[2]):
    try:
        out.append({"ok": True, "data": Client(sys.argv[1], timeout=60).call(mtype, **fields)})
    except GmuxError as e:
        out.append({"ok": False, "error": str(e)})
print(json.dumps(out))
"""

# Run as a job of user A: everything it can read of gmuxd's directory and its own environment, then the ways it
# could try to act as an admin on another user's job.
ATTACKER = """
import json, os, subprocess, sys, zmq
from gmux import protocol
rt, victim, out = os.environ["GMUX_RUNTIME_DIR"], sys.argv[1], sys.argv[2]
readable = {}
for d, _, files in os.walk(rt):
    for f in files:
        try:
            readable[os.path.join(d, f)] = open(os.path.join(d, f), "rb").read(200).decode("latin-1")
        except OSError:
            pass
tokens = [os.environ.get("GMUX_JOB_TOKEN") or "", ""] + [v.strip() for v in readable.values()]
refusals = []
s = zmq.Context.instance().socket(zmq.DEALER)
s.connect("ipc://" + os.path.join(rt, "gmuxd.sock"))
for i, token in enumerate(tokens):
    for mtype in ("kill", "suspend"):
        s.send(protocol.encode(mtype, i + 1, admin=token[:128], job=victim))
        if not s.poll(10000):
            raise SystemExit("gmuxd did not answer")
        refusals.append(protocol.decode(s.recv()).get("error"))
cli = subprocess.run([sys.executable, "-m", "gmux.cli.gmux", "kill", victim], capture_output=True, text=True)
down = subprocess.run([sys.executable, "-m", "gmux.cli.gmux", "shutdown"], capture_output=True, text=True)
json.dump({"readable": sorted(readable), "refusals": refusals, "cli": [cli.returncode, cli.stderr],
           "shutdown": [down.returncode, down.stderr], "uid": os.getuid()}, open(out, "w"))
"""


def mirror_python(dst: str) -> tuple[str, dict]:
    """A venv in `dst` the users can run: this interpreter and its standard library hard-linked (or copied) out
    of a directory they cannot enter (e.g. a pyenv under /root, mode 0700), this checkout's site-packages by a
    symlink. Returns its python and the environment it needs (its libpython before the build's RUNPATH)."""
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    exe, base = os.path.realpath(sys.executable), sys.base_prefix

    def link(src, to):
        try:
            os.link(src, to)
        except OSError:   # another filesystem
            shutil.copy2(src, to)
    os.makedirs(f"{dst}/py/bin")
    os.makedirs(f"{dst}/py/lib")
    link(exe, f"{dst}/py/bin/{os.path.basename(exe)}")
    for f in os.listdir(f"{base}/lib"):
        if f.startswith("libpython"):
            link(os.path.realpath(f"{base}/lib/{f}"), f"{dst}/py/lib/{f}")
    shutil.copytree(f"{base}/lib/{ver}", f"{dst}/py/lib/{ver}", copy_function=link,
                    ignore=shutil.ignore_patterns("site-packages", "test"))
    os.makedirs(f"{dst}/venv/bin")
    os.makedirs(f"{dst}/venv/lib/{ver}")
    os.symlink(f"{dst}/py/bin/{os.path.basename(exe)}", f"{dst}/venv/bin/python")
    os.symlink(os.path.join(sys.prefix, "lib", ver, "site-packages"), f"{dst}/venv/lib/{ver}/site-packages")
    with open(f"{dst}/venv/pyvenv.cfg", "w") as f:
        f.write(f"home = {dst}/py/bin\ninclude-system-site-packages = false\nversion = {sys.version.split()[0]}\n")
    return f"{dst}/venv/bin/python", {"LD_LIBRARY_PATH": f"{dst}/py/lib"}


# B's job: trains (an optimizer step per mini-batch: boundaries to suspend at) until told to stop by a file,
# so that it outlives whatever the test tries against it and then ends cleanly, on the test's word.
UNTIL = """
import json, os, sys, time, torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = 0
while not os.path.exists(sys.argv[1]) or steps < 5:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    steps += 1
    time.sleep(0.02)
json.dump({"steps": steps, "uid": os.getuid()}, open(sys.argv[2], "w"))
"""


class Users:
    """Throwaway groups and users, and how to run things as them; removed at the end."""

    def __init__(self):
        tag = secrets.token_hex(3)
        self.tmp = tempfile.mkdtemp(prefix="gmux-users-")
        os.chmod(self.tmp, 0o755)     # (our own temp dir) the users pass through it to the socket and home
        self.py, self.env = PY, env()
        self.group, self.admins = f"gmxs{tag}", f"gmxa{tag}"
        self.made_groups, self.made_users = [], []
        for g in (self.group, self.admins):
            subprocess.run(["groupadd", g], check=True, capture_output=True)
            self.made_groups.append(g)
        self.uid = {}
        for who, groups in (("a", self.group), ("b", self.group), ("adm", f"{self.group},{self.admins}"),
                            ("out", None)):
            name = f"gmx{who}{tag}"
            subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", "-d", self.home(who)]
                           + (["-G", groups] if groups else []) + [name], check=True, capture_output=True)
            self.made_users.append(name)
            pw = pwd.getpwnam(name)
            self.uid[who] = (pw.pw_uid, pw.pw_gid, name)
            os.makedirs(self.home(who), mode=0o700)
            os.chown(self.home(who), pw.pw_uid, pw.pw_gid)

    def home(self, who: str) -> str:
        return os.path.join(self.tmp, f"home-{who}")

    def name(self, who: str) -> str:
        return self.uid[who][2]

    def run(self, who: str, argv: list, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        uid, gid, name = self.uid[who]
        e = dict(self.env, HOME=self.home(who), USER=name, LOGNAME=name)
        return subprocess.run(argv, user=uid, group=gid, extra_groups=os.getgrouplist(name, gid), env=e,
                              cwd=self.home(who), capture_output=True, text=True, timeout=timeout, **kw)

    def popen(self, who: str, argv: list, log: str) -> subprocess.Popen:
        uid, gid, name = self.uid[who]
        e = dict(self.env, HOME=self.home(who), USER=name, LOGNAME=name)
        with open(os.path.join(self.tmp, log), "ab") as out:
            return subprocess.Popen(argv, user=uid, group=gid, extra_groups=os.getgrouplist(name, gid), env=e,
                                    cwd=self.home(who), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def close(self) -> None:
        # userdel refuses a user with processes: end those this test started as them (none should be left)
        uids = {u for u, _, _ in self.uid.values()}
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                with open(f"/proc/{pid}/status") as f:
                    uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
                if uid in uids:
                    os.kill(pid, signal.SIGKILL)
            except (OSError, StopIteration, ValueError):
                pass
        for name in self.made_users:
            subprocess.run(["userdel", name], capture_output=True)
        for g in self.made_groups:
            subprocess.run(["groupdel", g], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def users():
    if CANNOT_MAKE_USERS:
        pytest.skip(CANNOT_MAKE_USERS)
    u = Users()
    try:
        try:
            runs = u.run("a", [PY, "-c", "import gmux, zmq"]).returncode == 0
        except PermissionError:   # the interpreter lies where the users cannot go
            runs = False
        if not runs:
            py, extra = mirror_python(os.path.join(u.tmp, "python"))
            u.py, u.env = py, {**u.env, **extra}
            check = u.run("a", [u.py, "-c", "import gmux, zmq"])
            if check.returncode != 0:
                pytest.skip(f"a throwaway user cannot run this checkout's python ({PY}, nor a copy of it "
                            f"made in {u.tmp}): {check.stderr[-300:]}")
        yield u
    finally:
        u.close()


@contextlib.contextmanager
def system_gmuxd(users, name: str, *args: str, **popen):
    """A gmuxd --system (as root) on virtual GPUs, its runtime dir users.tmp/NAME in the users' reach, its log
    users.tmp/NAME.log; yields the runtime dir, and stops gmuxd (SIGTERM) at the end."""
    rt, log_path = os.path.join(users.tmp, name), os.path.join(users.tmp, f"{name}.log")
    # (gmuxd starts jobs with its own interpreter: the one the users can run)
    with open(log_path, "ab") as log:
        d = subprocess.Popen([users.py, "-m", "gmux.cli.gmuxd", "--system", "--runtime-dir", rt, "--socket-group",
                              users.group, *args], env=users.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                             **popen)
    try:
        wait_for(lambda: d.poll() is not None or ask(users, rt, None, [("ping", {})])[0]["ok"], 30,
                 "gmuxd --system did not come up")
        assert d.poll() is None, open(log_path).read()
        yield rt, d
    finally:
        d.send_signal(signal.SIGTERM)
        try:
            d.wait(20)
        except subprocess.TimeoutExpired:
            d.kill()


@pytest.fixture(scope="module")
def system(users):
    with system_gmuxd(users, "rt", "--admin-group", users.admins, "--virtual-gpus", "4x1GiB") as (rt, _):
        yield rt


def submit_until(users, rt: str, who: str, name: str) -> tuple[str, str, str]:
    """A job of `who`'s, submitted, that trains until its stop file exists: (job, stop file, its output)."""
    stop, out = os.path.join(users.home(who), f"stop-{name}"), os.path.join(users.home(who), f"{name}.json")
    sub = users.run(who, [users.py, "-m", "gmux.cli.gmux", "--runtime-dir", rt, "--json", "submit", "--name", name,
                          "--", "python", put(users, who, f"until-{name}.py", UNTIL), stop, out])
    assert sub.returncode == 0, sub.stderr
    return json.loads(sub.stdout)["job"], stop, out


def ask(users: Users, rt: str, who, requests: list) -> list:
    """Requests to gmuxd as the user `who` (None: root), through the ordinary client."""
    argv = [users.py, "-c", ASK, rt, json.dumps([[m, f] for m, f in requests])]
    out = (subprocess.run(argv, env=users.env, cwd=ROOT, capture_output=True, text=True, timeout=60) if who is None
           else users.run(who, argv))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def ps(users, rt, who=None) -> dict:
    (r,) = ask(users, rt, who, [("ps", {"all": True})])
    assert r["ok"], r
    return {j["id"]: j for j in r["data"]["jobs"]}


def real_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))


def put(users: Users, who: str, name: str, text: str) -> str:
    path = os.path.join(users.home(who), name)
    with open(path, "w") as f:
        f.write(text)
    os.chown(path, *users.uid[who][:2])
    return path


def test_users_act_only_on_their_own_jobs_and_jobs_are_never_admins(users, system):
    rt = system
    gmux = [users.py, "-m", "gmux.cli.gmux", "--runtime-dir", rt]
    # B submits a job (gmuxd starts it as B); A launches one of its own from a shell (it registers itself) and
    # submits another that will try to act as an admin (all start at once: each imports torch first).
    b_job, stop, b_out = submit_until(users, rt, "b", "bees")
    a_launch = users.popen("a", [users.py, "-m", "gmux.cli.launch", "--runtime-dir", rt, "--no-hook", "--", "python",
                                 TRAIN, os.path.join(users.home("a"), "a.json"), "100000", "--sleep", "0.02",
                                 "--attach"], "a.log")
    report = os.path.join(users.home("a"), "attack.json")
    sub = users.run("a", gmux + ["--json", "submit", "--", "python", put(users, "a", "attack.py", ATTACKER),
                                 b_job, report])
    assert sub.returncode == 0, sub.stderr
    attacker = json.loads(sub.stdout)["job"]
    a_job = wait_for(lambda: next((i for i, j in ps(users, rt).items() if j["pid"] == a_launch.pid), None), 60,
                     "A's job registered")
    jobs = wait_for(lambda: (lambda j: all(j[i]["state"] == "running" and j[i]["step"] > 0 for i in (a_job, b_job))
                             and j)(ps(users, rt)), 60, lambda: f"A's and B's jobs running: {ps(users, rt)}")
    assert jobs[b_job]["user"] == users.name("b") and jobs[a_job]["user"] == users.name("a")
    assert real_uid(jobs[b_job]["pid"]) == users.uid["b"][0], "a submitted job runs as its user, not as root"

    # A on B's job: every action refused, naming the owner; the job is left as it was.
    free = ({0, 1, 2, 3} - {j["gpu"] for j in jobs.values()}).pop()
    refused = ask(users, rt, "a", [("kill", {"job": b_job}), ("suspend", {"job": b_job}), ("resume", {"job": b_job}),
                                   ("logs", {"job": b_job}), ("migrate", {"job": b_job, "gpu": free}),
                                   ("checkpoint", {"job": b_job}), ("shutdown", {})])
    for r in refused[:-1]:
        assert not r["ok"] and f"belongs to {users.name('b')}, not to you ({users.name('a')})" in r["error"], r
    assert not refused[-1]["ok"] and "only an admin" in refused[-1]["error"]
    cli = users.run("a", gmux + ["kill", b_job])
    assert cli.returncode == 1 and f"job {b_job} belongs to {users.name('b')}" in cli.stderr, cli.stderr
    assert set(ps(users, rt, "a")) == {a_job, attacker}, "a user's ps lists their own jobs"
    b = ps(users, rt, "b")[b_job]
    assert b["state"] == "running" and not b["held"] and b["gpu"] == jobs[b_job]["gpu"], b
    # a user outside the socket group cannot even connect
    outsider = users.run("out", gmux + ["ps"])
    assert outsider.returncode == 1 and b_job not in outsider.stdout
    assert f"permission denied. A system gmuxd serves the members of {users.group}" in outsider.stderr
    # and a user cannot start a system daemon (it must be root to run jobs as their users)
    own = users.run("a", [users.py, "-m", "gmux.cli.gmuxd", "--system", "--runtime-dir", users.home("a") + "/rt"])
    assert own.returncode == 2 and "--system runs as root" in own.stderr, own.stderr

    # A acts on its own job: moves it to a free GPU in a new process (its checkpoint goes to A's own directory,
    # and it goes on from there while the rest goes on).
    (moved,) = ask(users, rt, "a", [("migrate", {"job": a_job, "gpu": free, "new_process": True})])
    assert moved["ok"], moved
    ckpt = os.stat(os.path.join(rt, "users", str(users.uid["a"][0]), f"{a_job}.ckpt"))
    assert ckpt.st_uid == users.uid["a"][0] and ckpt.st_mode & 0o077 == 0

    # The admin group's member acts on anyone's job.
    adm = ask(users, rt, "adm", [("suspend", {"job": b_job}), ("logs", {"job": b_job}), ("resume", {"job": b_job})])
    assert all(r["ok"] for r in adm), adm
    assert adm[0]["data"]["kind"] in ("suspend", "stop")    # (stop: it missed its deadline, on a loaded machine)
    assert set(ps(users, rt, "adm")) == {a_job, b_job, attacker}

    # A's job, with everything it could read, tried to be an admin.
    wait_for(lambda: os.path.exists(report) or ps(users, rt)[attacker]["state"] in ("failed", "exited"), 60,
             "the attacking job's report")
    got = json.load(open(report))
    assert got["uid"] == users.uid["a"][0]
    assert got["readable"] == [], "a job reads nothing of gmuxd's directory (no token, no database)"
    assert got["refusals"] and all(f"belongs to {users.name('b')}" in r for r in got["refusals"]), got["refusals"]
    assert got["cli"][0] == 1 and "belongs to" in got["cli"][1], got["cli"]
    assert got["shutdown"][0] == 1 and "only an admin" in got["shutdown"][1], got["shutdown"]

    # (started: restored and at a boundary again; a restore overdue on a loaded machine shows running before)
    wait_for(lambda: (lambda j: j["gpu"] == free and j["state"] == "running" and j["migrations"] == 1
                      and j["started"])(ps(users, rt, "a")[a_job]), 60, lambda: f"A's job running on GPU {free}: {ps(users, rt, 'a')[a_job]}")
    # ... and back, in its own process this time (the pid it has had all along, A's job still)
    pid = ps(users, rt, "a")[a_job]["pid"]
    (back,) = ask(users, rt, "a", [("migrate", {"job": a_job, "gpu": jobs[a_job]["gpu"]})])
    assert back["ok"] and back["data"]["path"] == "in process", back
    wait_for(lambda: (lambda j: j["gpu"] == jobs[a_job]["gpu"] and j["state"] == "running" and j["migrations"] == 2
                      and j["pid"] == pid)(ps(users, rt, "a")[a_job]), 60,
             lambda: f"A's job running on GPU {jobs[a_job]['gpu']}: {ps(users, rt, 'a')[a_job]}")
    (killed,) = ask(users, rt, None, [("kill", {"job": a_job})])     # root acts on anyone's job
    assert killed["ok"], killed
    # B's job, untouched by A, finishes its run when B says.
    with open(stop, "w"):
        pass
    wait_for(lambda: ps(users, rt, "b")[b_job]["state"] in ("exited", "failed", "killed", "lost"), 60,
             lambda: f"B's job to end: {ps(users, rt, 'b')[b_job]}")
    b = ps(users, rt, "b")[b_job]
    assert b["state"] == "exited" and b["exit_status"] == 0 and b["suspends"] + b["stops"] >= 1, b
    assert json.load(open(b_out))["uid"] == users.uid["b"][0]
    record = os.stat(os.path.join(rt, "users", str(users.uid["b"][0]), f"{b_job}.exit"))
    assert record.st_uid == users.uid["b"][0], "the job's exit record is in its user's own directory"
    assert ps(users, rt)[a_job]["detail"] == "killed by gmux kill"
    a_launch.wait(20)


def test_the_kernel_names_an_ipc_peer(tmp_path):
    """What every rule above rests on (runs as any user): a served request carries the sender's uid, gid and
    pid as the kernel gave them, whatever the message says."""
    import zmq
    from gmux.wire.server import Caller, Server, configure
    ctx = zmq.Context.instance()
    sock = configure(ctx.socket(zmq.ROUTER))
    sock.bind(f"ipc://{tmp_path}/s.sock")
    seen = []
    server = Server(sock, {"ping": lambda req: seen.append(req.caller) or {}}, name="t", credentials=True)
    client = ctx.socket(zmq.DEALER)
    client.connect(f"ipc://{tmp_path}/s.sock")
    client.send(protocol.encode("ping", 1))
    server.serve(lambda: None, lambda: bool(seen), poll_s=0.05)
    assert seen == [Caller(os.getuid(), os.getgid(), os.getpid())]
    assert protocol.decode(client.recv())["ok"]
    client.close(0)
    sock.close(0)


# --- the same rules in-process: a system daemon whose requests come with the credentials a test chooses ---
class Peer:
    """A received frame as the server sees it, with the kernel's word on its sender."""

    def __init__(self, frame: bytes, uid: int, gid: int, pid: int):
        self.bytes, self.address = frame, f"localhost:{uid}:{gid}:{pid}"

    def get(self, name: str) -> str:
        assert name == "Peer-Address"
        return self.address


@pytest.fixture
def sysd_factory(users, tmp_path, daemon_factory):
    """make() -> a system Daemon in this process on tmp_path/rt (again: a restarted one), replies captured."""
    def make():
        d = daemon_factory((4 * GiB, 4 * GiB), root=str(tmp_path / "rt"),
                           system=SystemMode(grp_gid(users.group), grp_gid(users.admins)))
        d.pid = d.stand_in_pid   # root's: a job claiming it is never signalled for a user
        return d
    return make


@pytest.fixture
def sysd(sysd_factory):
    return sysd_factory()


def grp_gid(name: str) -> int:
    import grp
    return grp.getgrnam(name).gr_gid


def call(d, users, who, mtype, identity=b"c", **fields) -> dict:
    """A request from a process of user `who` whose pid is d.pid."""
    uid, gid, _ = users.uid[who]
    d.sent.clear()
    d.server.receive(identity, [Peer(protocol.encode(mtype, 5, **fields), uid, gid, d.pid)])
    replies = [m for i, m in d.sent if m["type"] == "reply" and i == identity]
    return replies[0] if replies else None    # None: deferred (it waits for the job)


def test_system_tree_socket_and_no_admin_token(sysd, users):
    import stat
    st = os.stat(sysd.rundir.root)
    assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_gid == grp_gid(users.group) and st.st_uid == 0
    sock = os.stat(sysd.rundir.socket)
    assert stat.S_IMODE(sock.st_mode) == 0o660 and sock.st_gid == grp_gid(users.group)
    assert not os.path.exists(sysd.rundir.admin_token_file)
    sysd._flush(force=True)
    for name in os.listdir(sysd.rundir.root):    # the database (every job's token) is root's alone
        path = os.path.join(sysd.rundir.root, name)
        assert stat.S_ISDIR(os.stat(path).st_mode) or name == "gmuxd.sock" or os.stat(path).st_mode & 0o077 == 0, name
    assert stat.S_IMODE(os.stat(sysd.rundir.users()).st_mode) == 0o711
    # a message the kernel did not attribute (not ipc) is refused, never served as nobody in particular
    sysd.sent.clear()
    sysd.server.receive(b"c", [protocol.encode("ping", 5)])
    assert "cannot tell which local user" in sysd.sent[0][1]["error"]


def test_a_process_registers_only_itself_and_owns_what_it_registers(sysd, users):
    other = call(sysd, users, "a", "register", pid=sysd.pid + 100000, argv=["python", "t.py"])
    assert not other["ok"] and "is not the registering process" in other["error"] and not sysd.jobs
    reg = call(sysd, users, "a", "register", pid=sysd.pid, argv=["python", "t.py"],
               gang={"id": "g", "rank": 0, "size": 2})["data"]
    job = sysd.jobs[reg["job"]]
    assert (job.uid, job.gid) == users.uid["a"][:2]
    user_dir = os.stat(sysd.rundir.user_dir(users.uid["a"][0]))
    assert user_dir.st_uid == users.uid["a"][0] and user_dir.st_mode & 0o777 == 0o700
    # A's token is worth nothing to B; B cannot join A's gang (its ranks are suspended and killed together)
    leaked = call(sysd, users, "b", "heartbeat", job=reg["job"], token=reg["token"], state="running")
    assert not leaked["ok"] and "wrong token" in leaked["error"]
    joined = call(sysd, users, "b", "register", pid=sysd.pid, argv=["python", "t.py"],
                  gang={"id": "g", "rank": 1, "size": 2})
    assert not joined["ok"] and f"gang g is {users.name('a')}'s" in joined["error"]
    # root's process registered as A's job (only a test can do that) is never signalled for A's job
    assert not sysd.sup.kill(job) and sysd.sup.stopped_outside(job) is False


def test_a_refused_request_changes_nothing(sysd, users):
    reg = call(sysd, users, "a", "register", pid=sysd.pid, argv=["python", "t.py"])["data"]
    job = sysd.jobs[reg["job"]]
    sysd.tick()    # it is sent its start
    slicer = sysd.slicers[job.gpu]

    def state():
        return (job.state, job.held, job.gpu, job.kill_requested, set(slicer.entries), set(slicer.resident),
                slicer.busy_with(job.id), len(sysd.commands.inflight))
    before = state()
    for mtype in ("suspend", "kill", "migrate", "resume", "logs"):
        fields = {"gpu": 1 - job.gpu} if mtype == "migrate" else {}
        r = call(sysd, users, "b", mtype, admin="", job=job.id, **fields)
        assert not r["ok"] and f"belongs to {users.name('a')}" in r["error"], r
    assert state() == before and sysd.server.internal_errors == 0
    assert call(sysd, users, "b", "ps", admin="")["data"]["jobs"] == []
    (mine,) = call(sysd, users, "a", "ps", admin="")["data"]["jobs"]
    assert mine["user"] == users.name("a")
    # the admin group's member acts by who they are (the token field is ignored: there is none)
    call(sysd, users, "adm", "suspend", admin="", job=job.id)
    assert job.held and state() != before


def test_a_users_directory_must_be_theirs(users, tmp_path):
    rd = RuntimeDir(str(tmp_path / "rt"))
    rd.create(grp_gid(users.group))
    os.mkdir(rd.user_dir(users.uid["a"][0]))     # made by root, not given to A: not one gmuxd made
    with pytest.raises(RuntimeDirError, match="not a user's directory"):
        rd.create(grp_gid(users.group))
    # nor may the system directory lie where a user could swap it for one of theirs
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    with pytest.raises(RuntimeDirError, match="another user could replace"):
        RuntimeDir(str(shared / "rt")).create(grp_gid(users.group))
    assert not (shared / "rt").exists()


def test_owners_survive_a_restart(sysd_factory, users):
    d = sysd_factory()
    reg = call(d, users, "a", "register", pid=d.pid, argv=["python", "t.py"])["data"]
    d.close()
    again = sysd_factory()    # the same directory, taken over: the job re-attached with its owner
    assert again.jobs[reg["job"]].uid == users.uid["a"][0]
    r = call(again, users, "b", "kill", admin="", job=reg["job"])
    assert not r["ok"] and f"belongs to {users.name('a')}" in r["error"]
    assert call(again, users, "a", "heartbeat", job=reg["job"], token=reg["token"], state="running")["ok"]


def test_a_user_kept_out_is_told_whose_gmuxd_it_is_and_never_to_join_a_privileged_group(tmp_path):
    """root's own gmuxd (a directory only root enters) was called a system gmuxd, and the advice was to join
    group root (usermod -aG root USER)."""
    import grp

    from gmux.wire.daemon_client import closed_message
    if os.geteuid() != 0:
        pytest.skip("giving root a directory needs root")
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    os.chown(own, 0, 0)
    text = closed_message(str(own))
    assert "it is root's own gmuxd, which serves only them" in text and "usermod" not in text
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    os.chmod(shared, 0o750)
    os.chown(shared, 0, 0)
    text = closed_message(str(shared))
    assert "A system gmuxd serves the members of root" in text and "usermod" not in text
    plain = next((g for g in grp.getgrall() if g.gr_gid != 0 and g.gr_name not in ("wheel", "sudo", "admin", "adm",
                                                                                     "docker", "disk", "shadow",
                                                                                     "staff")), None)
    if plain is not None:
        os.chown(shared, 0, plain.gr_gid)
        assert f"usermod -aG {plain.gr_name} USER" in closed_message(str(shared))


def test_a_silent_system_gmuxd_is_never_said_to_be_startable_by_its_users(users, system):
    """A user cannot read a system gmuxd's pid file, so one that did not answer (stopped here; busy alike) was said
    to be not answering, with advice to start it (`gmuxd --runtime-dir ... &`): the administrator's to do."""
    pid, _ = RuntimeDir(system).daemon_process()
    short = ("import sys\nfrom gmux.wire.daemon_client import Client, GmuxError\ntry:\n"
             "    Client(sys.argv[1], timeout=3).call('ps')\nexcept GmuxError as e:\n    print(e)\n")
    os.kill(pid, signal.SIGSTOP)
    try:
        out = users.run("a", [users.py, "-c", short, system])
    finally:
        os.kill(pid, signal.SIGCONT)
    assert "the machine's system gmuxd" in out.stdout and "Start it" not in out.stdout, out.stdout + out.stderr
    assert ask(users, system, "a", [("ping", {})])[0]["ok"]      # continued, it answers again


def test_a_job_enters_its_directory_as_its_user_and_never_one_closed_to_them(users, system):
    """B's home is closed to A (0700); a directory inside it open to all (0755) is still out of A's reach, and a
    job of A's submitted there is refused, alike whether the directory exists: root's chdir would have let it in."""
    rt = system
    inside = os.path.join(users.home("b"), "open-inside")
    mine = os.path.join(users.home("a"), "mine")
    for d, who in ((inside, "b"), (mine, "a")):
        os.makedirs(d, mode=0o755, exist_ok=True)
        os.chown(d, *users.uid[who][:2])
    put(users, "b", "open-inside/data.txt", "B's")
    look = put(users, "a", "mine/look.py", "import os; print(sorted(os.listdir('.')), os.getcwd())")
    # (a shell's cd reads '..' before it enters anything: the check must be the launcher's own chdir)
    closed = (inside, os.path.join(inside, "missing"), os.path.join(inside, "..", "..", "home-a", "mine"), "-")
    asked = ask(users, rt, "a", [("submit", {"argv": ["python", look], "cwd": d, "name": f"look{i}"})
                                 for i, d in enumerate((*closed, mine))])
    for r, d in zip(asked, closed):
        said = ("the working directory '-' is not an absolute path" if d == "-" else
                f"{users.name('a')} cannot enter {d} (it does not exist, or is closed to them)")
        assert not r["ok"] and said in r["error"], r
    assert asked[-1]["ok"], asked[-1]        # A's own directory: the job runs there, as A
    job = asked[-1]["data"]["job"]
    wait_for(lambda: ps(users, rt, "a")[job]["state"] in ("exited", "failed"), 120, "A's job did not end")
    (r,) = ask(users, rt, "a", [("logs", {"job": job})])
    assert ps(users, rt, "a")[job]["state"] == "exited" and f"['look.py'] {mine}" in str(r["data"]), r


def test_only_the_user_database_makes_a_member_or_an_admin_not_what_a_process_kept(sysd, users):
    """A user removed from the socket group kept every right through a process that had started before (its
    groups are fixed at its start), and a process whose gid was the admin group counted as an admin's."""
    import grp
    reg = call(sysd, users, "a", "register", pid=sysd.pid, argv=["python", "t.py"])["data"]

    def as_(who, gid, mtype, **fields):
        uid = users.uid[who][0]
        sysd.sent.clear()
        sysd.server.receive(b"c", [Peer(protocol.encode(mtype, 5, **fields), uid, gid, sysd.pid)])
        return next(m for i, m in sysd.sent if m["type"] == "reply")
    socket_gid, admin_gid = grp.getgrnam(users.group).gr_gid, grp.getgrnam(users.admins).gr_gid
    for mtype, fields in (("ps", {"admin": ""}), ("register", {"pid": sysd.pid, "argv": ["python", "t.py"]})):
        r = as_("out", socket_gid, mtype, **fields)      # its process kept the group; the database has it out
        assert not r["ok"] and f"{users.name('out')} is not a member of group {users.group}" in r["error"], r
    r = as_("b", admin_gid, "kill", admin="", job=reg["job"])
    assert not r["ok"] and f"belongs to {users.name('a')}" in r["error"], r
    assert not sysd.jobs[reg["job"]].final and sysd.server.internal_errors == 0
    assert as_("b", users.uid["b"][1], "ps", admin="")["ok"]      # a member as the database has it


def test_a_process_is_one_job(sysd, users):
    """One process registered itself a hundred times: a hundred jobs, each given turns on the GPUs."""
    first = call(sysd, users, "a", "register", pid=sysd.pid, argv=["python", "t.py"])
    again = call(sysd, users, "a", "register", pid=sysd.pid, argv=["python", "t.py"])
    assert first["ok"] and not again["ok"] and f"is job {first['data']['job']} already" in again["error"]
    assert list(sysd.jobs) == [first["data"]["job"]]


def test_a_new_tables_claim_is_believed_only_from_a_process_older_than_gmuxd(sysd, users):
    """At every boot a system gmuxd's table is new (/run): any user could claim j999999999 before anything else,
    and every later id was ten digits. A job its predecessor started began before it did."""
    r = call(sysd, users, "a", "register", pid=sysd.pid, argv=["python", "t.py"], job="j999999999",
             token="t" * 32, adopt="running", on_gpu=0)
    assert not r["ok"] and f"process {sysd.pid} began after this gmuxd did" in r["error"], r
    assert sysd.store.mark() == "j1" and not sysd.jobs
