"""The gmux wire protocol: every message type, its fields and their types, in one place.

Frames are msgpack maps. Every message carries the protocol version `v`, its `type`, and a request `id`
chosen by the sender (echoed in the reply, so a client can match replies to requests). Clients (jobs, the
CLI, the cluster scheduler) talk to a daemon over a DEALER socket; the daemon answers every request with
a `reply` and pushes `command`s to jobs on its own initiative.

Nothing received is trusted: `decode` turns bytes into a validated `Message` or raises `ProtocolError`
naming the problem, and the daemon turns that error into an error reply. Validation is strict (unknown
fields are refused) so that a typo in a sender shows up at once instead of being silently ignored. Nested
payloads are typed too: a command's args by its kind, a cluster action's args by the action, results, reports
and events field by field.

Longer than 500 lines on purpose: the whole wire (every message, every field, every nested payload) is read in
one file, which is the point of having one.
"""
from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Optional

import msgpack

VERSION = 1
# The largest frame a daemon accepts. Reports and replies are a few KB; `ps` of hundreds of jobs well under
# this. Anything bigger is a bug or an attack, refused before it is parsed.
MAX_FRAME = 1 << 20
LOGS_REPLY_BYTES = MAX_FRAME // 2    # what one `logs` reply holds at most: the log's end
MAX_STR = 4096          # any single string field
MAX_LIST = 1024         # argv, env entries, ...
MAX_LISTED = 100_000    # what one ps or decisions lists at most
HEARTBEAT_S = 1.0       # a job waiting for a command says so this often (gmuxd takes a silent one as computing)


class ProtocolError(ValueError):
    """A message that is not valid gmux protocol; the text says what is wrong with it."""


# --- field kinds ---------------------------------------------------------------------------------------
# Each is a function(value) -> problem string or None. Kept tiny and composable rather than a schema library:
# the whole wire is visible in the MESSAGES table below.

def _str(v, max_len=MAX_STR):
    if not isinstance(v, str):
        return f"expected a string, got {type(v).__name__}"
    if len(v) > max_len:
        return f"string of {len(v)} characters exceeds {max_len}"
    return None


def _name(v):
    # Job ids and names appear in file names and log lines: keep them to a safe alphabet.
    p = _str(v, 128)
    if p:
        return p
    if not v or not all(c.isalnum() or c in "-_." for c in v) or v.startswith("."):
        return f"{v!r} is not a valid name (letters, digits, '-', '_', '.'; not starting with '.')"
    return None


# Scripts with letters drawn alike (a Cyrillic 'ј' and a Latin 'j'): one name must not mix them.
_LOOKALIKE_SCRIPTS = ("LATIN", "GREEK", "CYRILLIC", "ARMENIAN", "CHEROKEE", "COPTIC")


def _char(c: str) -> str:
    return f"{c!r} (U+{ord(c):04X} {unicodedata.name(c, 'unnamed')})"


def job_name_problem(v) -> Optional[str]:
    """Why `v` may not name a job or a gang, else None: gmuxd's rule, and the command line's (gmux/cli/argtypes.py)
    in the same words. A name picks a job out wherever its id would (gmux kill NAME), so one that reads as
    something else is refused: one that reads as a job id (j45, J45; a letter and digits, the letter not ASCII:
    Cyrillic 'ј45', fullwidth 'Ｊ99'), one Unicode writes another way (NFKC: 'ﬁne' is 'fine'), one that mixes
    scripts drawn alike within a word (a run of letters: 'rеsnet' with a Cyrillic 'е'; 'β-vae', a word of each,
    is a name people give)."""
    problem = _name(v)
    if problem:
        return problem
    if v.startswith("-"):   # (taken, the job could not be named: `gmux kill -foo` read it as an option)
        return (f"{v!r} starts with '-', which reads as an option on the command line (gmux kill {v}); choose "
                f"another name")
    folded = unicodedata.normalize("NFKC", v)
    unusual = ", ".join(map(_char, [c for c in dict.fromkeys(v) if not c.isascii()][:3]))
    if re.fullmatch(r"[^\W\d_]\d+", folded) and (folded[0] in "jJ" or not folded[0].isascii()):
        written = f": it is written with {unusual}" if unusual else ""
        return f"{v!r} looks like a job id (gmux names jobs j1, j2, ...){written}; choose another name"
    if folded != v:
        return f"{v!r} reads as {folded!r} (written with {unusual}); type the name in plain characters"
    for word in re.findall(r"[^\W\d_]+", v):
        scripts: dict = {}
        for c in word:
            script = unicodedata.name(c, "").split(" ")[0]
            if script in _LOOKALIKE_SCRIPTS:
                scripts.setdefault(script, c)
        if len(scripts) > 1:
            return (f"{v!r} mixes {' and '.join(s.title() for s in scripts)} letters in a word "
                    f"({', '.join(map(_char, scripts.values()))}), which look alike; write each word in one of them")
    return None


def cluster_job_name_problem(v) -> Optional[str]:
    """job_name_problem's, and a name that reads as a cluster job's id (c7, C7): the scheduler picks a job out by
    its name wherever by its id, so `--name c7` hid cluster job c7. (On a machine, c7 is the name gmux gives
    cluster job c7's own job there, and is taken.)"""
    problem = job_name_problem(v)
    if problem is None and re.fullmatch(r"[cC]\d+", v):
        return f"{v!r} looks like a cluster job's id (gmux names them c1, c2, ...); choose another name"
    return problem


def _int(v, lo=-(1 << 62), hi=(1 << 62)):
    if isinstance(v, bool) or not isinstance(v, int):
        return f"expected an integer, got {type(v).__name__}"
    if not lo <= v <= hi:
        return f"{v} is outside [{lo}, {hi}]"
    return None


def _nonneg_int(v):
    return _int(v, 0)


MAX_GPU_INDEX = 4096


def _gpu_index(v):
    return _int(v, 0, MAX_GPU_INDEX)


MAX_SECONDS = 1e6      # the longest time a message carries (a checkpoint period, a deadline): about 11 days


def _pos_float(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"expected a number, got {type(v).__name__}"
    if not math.isfinite(v) or v <= 0 or v > MAX_SECONDS:
        return f"{v} is not a finite number in (0, 1e6]"
    return None


WEIGHTS = (1e-3, 1e3)    # a job's share of GPU time, relative: a weight of 5e-324 made every share infinite


def _weight(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"expected a number, got {type(v).__name__}"
    if not (math.isfinite(v) and WEIGHTS[0] <= v <= WEIGHTS[1]):
        return f"{v} is not a weight in [{WEIGHTS[0]:g}, {WEIGHTS[1]:g}]"
    return None


def _float(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return f"expected a number, got {type(v).__name__}"
    if not math.isfinite(v):
        return f"{v} is not finite"
    return None


def _bool(v):
    return None if isinstance(v, bool) else f"expected true/false, got {type(v).__name__}"


def _exec_str(v, max_len=MAX_STR):
    """A string handed to the kernel when a process starts (argument, environment, directory): no NUL byte,
    which exec cannot pass."""
    p = _str(v, max_len)
    if p:
        return p
    return "holds a NUL byte, which no process argument, environment entry or path can" if "\0" in v else None


def _str_list(v):
    if not isinstance(v, list):
        return f"expected a list of strings, got {type(v).__name__}"
    if len(v) > MAX_LIST:
        return f"list of {len(v)} items exceeds {MAX_LIST}"
    for i, item in enumerate(v):
        p = _exec_str(item)
        if p:
            return f"item {i}: {p}"
    return None


def _argv(v):
    p = _str_list(v)
    if p:
        return p
    return "argv is empty: give the command to run" if not v else None


def _env(v):
    if not isinstance(v, dict):
        return f"expected a map of strings, got {type(v).__name__}"
    if len(v) > MAX_LIST:
        return f"{len(v)} entries exceed {MAX_LIST}"
    for k, val in v.items():
        name, value = _str(k, 256), _str(val)
        if name or value:
            return f"entry {str(k)[:40]!r}: " + (f"its name: {name}" if name else f"its value: {value}")
        if not k or "=" in k or "\0" in k or "\0" in val:
            return f"entry {str(k)[:40]!r}: a name without '=' and a value, neither holding a NUL byte"
    return None


def _optional(check):
    def f(v):
        return None if v is None else check(v)
    return f


def _fields(obj: dict, spec: dict) -> Optional[str]:
    """What is wrong with a nested map checked field by field against `spec` (same form as a MESSAGES entry)."""
    for key, value in obj.items():
        if key not in spec:
            return f"unknown field {str(key)[:60]!r}; expected {', '.join(spec) or 'none'}"
        problem = spec[key][0](value)
        if problem:
            return f"{key}: {problem}"
    for key, (_, required) in spec.items():
        if required and key not in obj:
            return f"missing field {key!r}"
    return None


def _map(spec: dict):
    """A nested map with typed fields."""
    def f(v):
        return f"expected a map, got {type(v).__name__}" if not isinstance(v, dict) else _fields(v, spec)
    return f


# What a move's new process already holds (gmux.job.holdings): concatenated digests of its tensors' bytes, as
# its link serves them to the move's source (xfer_holds) and the source's link hands them to the job's
# checkpoint. At most HOLDS_MAX (512 KiB: a message stays under MAX_FRAME).
HOLDS_DIGEST_BYTES = 16
HOLDS_MAX = 32768


def holds_problem(v):
    if not isinstance(v, bytes):
        return f"expected bytes, got {type(v).__name__}"
    if len(v) % HOLDS_DIGEST_BYTES or len(v) > HOLDS_MAX * HOLDS_DIGEST_BYTES:
        return f"{len(v)} bytes are not at most {HOLDS_MAX} digests of {HOLDS_DIGEST_BYTES} bytes"
    return None


def _seal_key(v):
    if not isinstance(v, bytes) or len(v) != 32:
        return "expected a key of 32 bytes"
    return None


MAX_FIGURES = 64


def _figure(v):
    """One measurement: a number, a flag, a short text, nothing, or a small map of names to numbers (bytes by
    tag)."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return _int(v) if isinstance(v, int) else _float(v)
    if isinstance(v, str):
        return _str(v, 1024)
    if isinstance(v, dict):
        if len(v) > MAX_FIGURES:
            return f"map of {len(v)} entries exceeds {MAX_FIGURES}"
        for k, x in v.items():
            if _str(k, 128) or isinstance(x, bool) or not isinstance(x, (int, float)) or _figure(x):
                return f"entry {str(k)[:40]!r}: expected a name and a number"
        return None
    return f"expected a number, flag, text or map of numbers, got {type(v).__name__}"


def _figures(known: dict):
    """A job's report or a command's result: the fields in `known`, typed, and any other measurement as a
    figure (the runtime adds figures as it learns to measure more; the daemon reads only the known ones)."""
    def f(v):
        if not isinstance(v, dict):
            return f"expected a map, got {type(v).__name__}"
        if len(v) > MAX_FIGURES:
            return f"map of {len(v)} entries exceeds {MAX_FIGURES}"
        for key, value in v.items():
            if not isinstance(key, str) or _str(key, 128):
                return f"keys must be names, got {str(key)[:40]!r}"
            problem = (known[key][0] if key in known else _figure)(value)
            if problem:
                return f"{key}: {problem}"
        for key, (_, required) in known.items():
            if required and key not in v:
                return f"missing field {key!r}"
        return None
    return f


class _By:
    """A nested map whose fields depend on another field of the same message: a command's args on its kind,
    a cluster action's args on the action."""

    def __init__(self, field: str, specs: dict):
        self.field, self.specs = field, specs

    def __call__(self, v):
        return None if isinstance(v, dict) else f"expected a map, got {type(v).__name__}"

    def within(self, value: dict, fields: dict) -> Optional[str]:
        spec = self.specs.get(fields.get(self.field))
        if spec is None:
            return None
        return spec(value) if callable(spec) else _fields(value, spec)


def _path(v):
    return "a path cannot be empty" if v == "" else _exec_str(v)


def _one_of(*choices):
    def f(v):
        return None if v in choices else f"{v!r} is not one of {', '.join(map(str, choices))}"
    return f


MAX_GANG = 4096   # ranks of one torch.distributed job (across machines: one machine sees some of them)


def _gang(v):
    """One rank of a gang: {id: name, rank: 0..size-1, size: ranks in all}."""
    if not isinstance(v, dict):
        return f"expected a map {{id, rank, size}}, got {type(v).__name__}"
    if set(v) != {"id", "rank", "size"}:
        return f"expected exactly the fields id, rank, size; got {', '.join(sorted(map(str, v)))[:80]}"
    problem = _name(v["id"])   # (a new gang's name the user chose is held to job_name_problem when it registers)
    if problem:
        return f"id: {problem}"
    problem = _int(v["size"], 1, MAX_GANG)
    if problem:
        return f"size: {problem}"
    problem = _int(v["rank"], 0, MAX_GANG)
    if problem:
        return f"rank: {problem}"
    if v["rank"] >= v["size"]:
        return f"rank {v['rank']} is not below the gang's size {v['size']} (ranks are 0..{v['size'] - 1})"
    return None


JOB_STATES = ("waiting", "running", "suspending", "suspended", "resuming", "stopped", "migrating", "held",
              "exited", "failed", "killed", "lost")
FINAL_STATES = ("exited", "failed", "killed", "lost")
COMMAND_KINDS = ("suspend", "resume", "checkpoint", "migrate", "spill", "exit")

# What each command carries (gmuxd -> job), by kind.
COMMAND_ARGS = {
    "suspend": {"in_place": (_bool, False)},   # held for a move: copy nothing out, keep the memory (gmux.job.job)
    "resume": {"gpu": (_gpu_index, False), "env": (_env, False)},   # the GPU it resumes on, and its environment
    # holds: what a move's target has already, left out of the checkpoint (gmux.job.holdings)
    "checkpoint": {"path": (_path, True), "holds": (holds_problem, False)},
    "migrate": {"path": (_path, True), "gpu": (_optional(_gpu_index), False),
                "spill": (_bool, False)},    # spill: checkpoint and end the process to give back its host memory
    "spill": {"path": (_path, True)},        # the host copy of a suspended job's state goes to this file
    "exit": {},
}
_JOB_STATE = _one_of("running", "suspended", "waiting")
_opt_count = _optional(_nonneg_int)
# A command's outcome (job -> gmuxd); the figures gmuxd reads are typed, any other is a measurement.
RESULT = {"ok": (_bool, True), "error": (_optional(_str), False), "bytes": (_opt_count, False),
          "seconds": (_optional(_float), False),
          "step": (_opt_count, False),    # a checkpoint's: the step it holds
          "in_place": (_optional(_bool), False),   # a suspend's or resume's: nothing was copied (in place)
          "warning": (_optional(_str), False)}    # a checkpoint's: what a new process will do otherwise
# A job's periodic report: what gmuxd reads to schedule it, and any other measurement.
REPORT = {"step": (_opt_count, False), "mem_boundary": (_opt_count, False), "mem_peak": (_opt_count, False),
          "batch_s": (_optional(_float), False), "rate": (_optional(_float), False),
          # a framework job (control "framework"): whether it can continue exactly in a new process, or why not
          "movable": (_optional(_bool), False), "unmovable": (_optional(lambda v: _str(v, 1024)), False),
          # the job's memory limit (its --mem; 0: none) and what counts against it now (gmux/job/memory/limit.py)
          "mem_limit": (_opt_count, False), "mem_in_use": (_opt_count, False),
          "mem_limit_soft": (_optional(_bool), False)}

# Fields every job-authenticated message carries: a job can only act on itself, proven by its token.
_AUTH = {"job": (_name, True), "token": (lambda v: _str(v, 128), True)}

# type -> {field: (check, required)}. The envelope fields v/type/id are common to all and checked separately.
MESSAGES: dict[str, dict[str, tuple]] = {
    # --- any client ---
    "ping": {},
    # --- a job (gmux-launch) asks to be admitted; or, with job+token, re-registers (after migration/restart) ---
    "register": {
        "pid": (_nonneg_int, True),
        "argv": (_str_list, True),
        "cwd": (_exec_str, False),
        # a new job's name is held to job_name_problem when it registers; one coming back (a move, an adoption)
        # keeps the name gmuxd gave it, also one an older gmux's rule allowed
        "name": (_optional(_name), False),
        "weight": (_weight, False),
        "mem": (_optional(_nonneg_int), False),     # declared working set, bytes; None: measure it
        "gpus": (lambda v: _int(v, 1, 64), False),
        "job": (_optional(_name), False),           # with token: a re-registration
        "token": (_optional(lambda v: _str(v, 128)), False),
        "starttime": (_optional(_nonneg_int), False),  # /proc start time: tells a reused pid apart
        "gpu": (_optional(_gpu_index), False),      # pin to this GPU; None: gmuxd places the job
        # The script restores itself from GMUX_RESTORE (explicit mode), so it can move to another process.
        "migratable": (_bool, False),
        # one rank of a torch.distributed job: gmuxd gives each rank a GPU of its own and acts on all ranks at once
        "gang": (_optional(_gang), False),
        # a gang rank whose runtime agrees with its peers on the boundary to act at (gmux.job.gang.GangController),
        # though the script itself attached nothing (transparent mode: a torchrun worker under gmux-launch)
        "agrees": (_bool, False),
        # a job that gmuxd's table lost (the reply "unknown"), registering again with its job and token to be
        # adopted: its state, and the GPU it was last resumed on (None: never started)
        "adopt": (_JOB_STATE, False),
        "on_gpu": (_optional(_gpu_index), False),
    },
    # --- a job about itself ---
    "report": {**_AUTH, "report": (_figures(REPORT), True), "state": (_JOB_STATE, False),
               "boundaries": (_nonneg_int, False)},
    # boundaries: mini-batch boundaries passed since the process started, stamped t by the job's clock
    # (the daemon's receive time would add queueing jitter to rates).
    "heartbeat": {**_AUTH, "state": (_JOB_STATE, True),
                  "boundaries": (_nonneg_int, False), "t": (_float, False)},
    "result": {**_AUTH, "cmd": (_nonneg_int, True), "kind": (_one_of(*COMMAND_KINDS), True),
               "result": (_figures(RESULT), True), "boundaries": (_nonneg_int, False),
               "state": (_JOB_STATE, False),
               # when the job took the command at a boundary (CLOCK_MONOTONIC, this machine's): gmuxd splits
               # a command's latency into the wait for that boundary (the mini-batch) and the rest (gmux's own)
               "taken_at": (_float, False)},
    "bye": {**_AUTH, "status": (_int, True), "reason": (_str, False)},
    # --- administration (the CLI, the scheduler): authenticated by the admin token in the runtime dir ---
    "ps": {"admin": (lambda v: _str(v, 128), True), "all": (_bool, False),
           "limit": (lambda v: _int(v, 1, MAX_LISTED), False)},   # jobs listed: the live first, then the newest ended
    # to_boundary: the caller needs the job at its boundary (a cross-machine move): at its deadline it is
    # stopped only if another job needs the GPU's compute, and continued once none does; in_place: its suspend
    # copies nothing out, its memory stays where it is until it resumes (the move checkpoints it from there)
    # deadline_s: stopped (SIGSTOP) if not suspended by then, when sooner than its own deadline (a cluster fence's)
    # for_move: refused, nothing held, unless every rank of the job would be restored exactly in a new process
    "suspend": {"admin": (lambda v: _str(v, 128), True), "job": (_name, True), "to_boundary": (_bool, False),
                "in_place": (_bool, False), "deadline_s": (_pos_float, False), "for_move": (_bool, False)},
    "resume": {"admin": (lambda v: _str(v, 128), True), "job": (_name, True)},
    # reason: what the job's record says ("killed by gmux kill" without one; a cluster link names its own)
    "kill": {"admin": (lambda v: _str(v, 128), True), "job": (_name, True), "reason": (lambda v: _str(v, 300), False)},
    # new_process: checkpoint and continue in a new process even where the move could be made in the job's own
    # process (between virtual GPUs); the path a real GPU's move takes
    "migrate": {"admin": (lambda v: _str(v, 128), True), "job": (_name, True), "gpu": (_gpu_index, True),
                "new_process": (_bool, False)},
    # raw: the log's bytes as written (gmux logs --raw), not text in which a byte that is not UTF-8 reads as U+FFFD
    "logs": {"admin": (lambda v: _str(v, 128), True), "job": (_name, True), "tail": (_nonneg_int, False),
             "raw": (_bool, False)},
    # write the job's state to a checkpoint file at its next boundary, the job going on (cluster mode: periodic
    # checkpoints, and the first half of a move to another machine)
    "checkpoint": {"admin": (lambda v: _str(v, 128), True), "job": (_name, True),
                   "holds": (holds_problem, False)},    # a move's: what its target holds already (not sent)
    "submit": {
        "admin": (lambda v: _str(v, 128), True),
        "argv": (_argv, True),
        "cwd": (_exec_str, True),
        "env": (_env, False),
        "name": (_optional(job_name_problem), False),
        "weight": (_weight, False),
        "mem": (_optional(_nonneg_int), False),
        "gpus": (lambda v: _int(v, 1, 64), False),
        "gpu": (_optional(_gpu_index), False),
        # gmuxd starts this many ranks of a gang (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in their env)
        "ranks": (lambda v: _int(v, 1, 64), False),
        "hook": (_bool, False),   # false: the script attach()es itself (gmux-launch --no-hook)
    },
    "decisions": {"admin": (lambda v: _str(v, 128), True), "limit": (lambda v: _int(v, 1, MAX_LISTED), False)},
    "shutdown": {"admin": (lambda v: _str(v, 128), True), "kill_jobs": (_bool, False)},
    # --- daemon -> client ---
    # busy: refused only for now (the job is in the middle of something that ends by itself): ask again later
    # unknown: the job a message names is not in gmuxd's table (a gmuxd whose table was lost): it may register
    # again to be adopted
    "reply": {"ok": (_bool, True), "error": (_str, False), "busy": (_bool, False), "unknown": (_bool, False),
              "data": (lambda v: None, False)},
    "command": {"cmd": (_nonneg_int, True), "kind": (_one_of(*COMMAND_KINDS), True),
                "args": (_By("kind", COMMAND_ARGS), True)},
}
JOB_TYPES = ("report", "heartbeat", "result", "bye")
ADMIN_TYPES = ("ps", "suspend", "resume", "kill", "migrate", "logs", "submit", "decisions", "shutdown", "checkpoint")


@dataclass
class Message:
    type: str
    id: int
    fields: dict

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]


def validate(obj: Any, table: Optional[dict] = None) -> Message:
    """Checks a decoded frame against MESSAGES (or another table, e.g. CLUSTER_MESSAGES); returns it as a
    Message or raises ProtocolError."""
    table = MESSAGES if table is None else table
    if not isinstance(obj, dict):
        raise ProtocolError(f"a message must be a map, got {type(obj).__name__}")
    v = obj.get("v")
    if v != VERSION:
        raise ProtocolError(f"protocol version {v!r} is not supported (this daemon speaks version {VERSION}); "
                            f"use gmux and gmuxd from the same installation")
    mtype = obj.get("type")
    if not isinstance(mtype, str) or mtype not in table:
        shown = repr(mtype)[:60]
        raise ProtocolError(f"unknown message type {shown}; known: {', '.join(sorted(table))}")
    mid = obj.get("id", 0)
    if _int(mid, 0, (1 << 63) - 1):
        raise ProtocolError(f"{mtype}: id must be a non-negative integer")
    spec = table[mtype]
    fields = {}
    for key, value in obj.items():
        if key in ("v", "type", "id"):
            continue
        if key not in spec:
            raise ProtocolError(f"{mtype}: unknown field {str(key)[:60]!r}; expected {', '.join(spec) or 'none'}")
        problem = spec[key][0](value)
        if problem:
            raise ProtocolError(f"{mtype}.{key}: {problem}")
        fields[key] = value
    for key, (check, required) in spec.items():
        if required and key not in fields:
            raise ProtocolError(f"{mtype}: missing field {key!r}")
        if isinstance(check, _By) and key in fields:
            problem = check.within(fields[key], fields)
            if problem:
                raise ProtocolError(f"{mtype}.{key}: {problem}")
    return Message(mtype, mid, fields)


def decode(frame: bytes, table: Optional[dict] = None) -> Message:
    """Bytes from the wire -> validated Message. Never raises anything but ProtocolError."""
    if len(frame) > MAX_FRAME:
        raise ProtocolError(f"message of {len(frame)} bytes exceeds the {MAX_FRAME}-byte limit")
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types (ExtraData, FormatError, ValueError, ...)
        raise ProtocolError(f"not a msgpack message: {type(e).__name__}: {str(e)[:100]}") from None
    try:
        return validate(obj, table)
    except ProtocolError:
        raise
    except Exception as e:     # a check that failed on a value it did not foresee: a refusal still, never a crash
        raise ProtocolError(f"message not understood: {type(e).__name__}: {str(e)[:100]}") from None


def peek_action(frame: bytes) -> tuple:
    """(action, cjob) of a node_action refused by `decode`, when both are valid, else (None, None): enough to
    tell the scheduler which job's action failed."""
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=False) if len(frame) <= MAX_FRAME else None
    except Exception:
        return None, None
    if not isinstance(obj, dict) or obj.get("type") != "node_action":
        return None, None
    action, cjob = obj.get("action"), obj.get("cjob")
    if action not in CLUSTER_ACTIONS or _name(cjob):
        return None, None
    return action, cjob


def encode(mtype: str, id: int = 0, table: Optional[dict] = None, **fields: Any) -> bytes:
    """A message as bytes. Validates outgoing messages too, so a sender's bug fails at the sender."""
    obj = {"v": VERSION, "type": mtype, "id": id, **fields}
    if mtype != "reply":
        validate(obj, table)
    return msgpack.packb(obj)


def reply(id: int, ok: bool = True, error: Optional[str] = None, data: Any = None, busy: bool = False,
          unknown: bool = False) -> bytes:
    obj: dict = {"v": VERSION, "type": "reply", "id": id, "ok": ok}
    if error is not None:
        obj["error"] = error
    if busy:
        obj["busy"] = True
    if unknown:
        obj["unknown"] = True
    if data is not None:
        obj["data"] = data
    return msgpack.packb(obj)


def error_reply(id: Any, error: str, busy: bool = False, unknown: bool = False) -> bytes:
    return reply(id if isinstance(id, int) and not isinstance(id, bool) and 0 <= id < (1 << 63) else 0,
                 ok=False, error=error, busy=busy, unknown=unknown)


# ======================================================================================================
# Cluster mode: gmux-scheduler <-> gmuxd (cluster link), clients -> gmux-scheduler, and checkpoint transfer
# between machines. A table of its own (CLUSTER_MESSAGES, decoded with `decode(frame, CLUSTER_MESSAGES)`), so
# the per-machine wire above is unchanged. These travel over TCP with CurveZMQ: a peer has already proven its
# key before any of this is parsed, but every field is still validated (a trusted peer can have a bug).
# ======================================================================================================
XFER_MAX_CHUNK = 4 << 20        # a checkpoint chunk (the raw second frame of an xfer_chunk)
MAX_RANKS = 64                  # processes of one gang (one per GPU of one machine)
XFER_MAX_SIZE = 1 << 40         # a checkpoint larger than 1 TiB is not one gmux wrote
# The exit of a cluster job that stopped itself because its gmuxd stopped answering (a start's `lease_s`): the scheduler
# starts it again from its checkpoint rather than counting it failed.
LEASE_LOST_STATUS = 75
LEASE_LOST_REASON = "its gmuxd stopped answering"
# abandon: a move's target gives up its start unless it has restored (its source's send was lost with its gmuxd):
# of="start"; its source, its send (the target failed, or restarted its gmuxd: its endpoint is dead): of="send"
CLUSTER_ACTIONS = ("start", "suspend", "resume", "kill", "move", "migrate_out", "release", "abandon")
# ready: a move's new processes are up and wait for their checkpoints (the source may suspend the job now)
CLUSTER_EVENTS = ("started", "ready", "start_failed", "suspended", "resumed", "moved", "migrate_sent", "migrate_failed",
                  "checkpointed", "released", "action_failed")
_Z85 = set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")


def _z85_key(v):
    p = _str(v, 40)
    if p:
        return p
    return None if len(v) == 40 and set(v) <= _Z85 else "expected a 40-character z85 CurveZMQ public key"


def _tcp_endpoint(v):
    p = _str(v, 256)
    if p:
        return p
    if not v.startswith("tcp://") or ":" not in v[6:]:
        return f"{v[:60]!r} is not a tcp://HOST:PORT endpoint"
    port = v.rsplit(":", 1)[1]
    return _int(int(port), 1, 65535) if port.isascii() and port.isdigit() else "port is not a number"


def _records(spec: dict, max_items: int = MAX_LIST):
    """A list of maps, each checked field by field against `spec` (same form as a MESSAGES entry)."""
    def f(v):
        if not isinstance(v, list):
            return f"expected a list, got {type(v).__name__}"
        if len(v) > max_items:
            return f"list of {len(v)} items exceeds {max_items}"
        for i, item in enumerate(v):
            problem = f"expected a map, got {type(item).__name__}" if not isinstance(item, dict) else \
                _fields(item, spec)
            if problem:
                return f"item {i}: {problem}"
        return None
    return f


_opt_float = _optional(_float)
_GPU_RECORD = {"index": (_gpu_index, True), "mem_total": (_nonneg_int, True)}
# One job as a daemon's cluster link sees it (from its gmuxd's table).
# One rank of a gang (a multi-GPU job: one process per GPU, all on one machine).
_RANK_RECORD = {"rank": (lambda v: _int(v, 0, MAX_RANKS - 1), True), "local": (_name, True),
                "gpu": (_optional(_gpu_index), True), "state": (_one_of(*JOB_STATES), True),
                "step": (_nonneg_int, True)}
_JOB_RECORD = {
    "cjob": (_name, True), "local": (_name, True), "state": (_one_of(*JOB_STATES), True),
    "step": (_nonneg_int, True), "gpu": (_optional(_gpu_index), True), "rate_now": (_opt_float, False),
    "rate_solo": (_opt_float, False), "mem_peak": (_optional(_nonneg_int), False),
    "gpu_seconds": (_float, False), "exit_status": (_optional(_int), False), "detail": (_str, False),
    "held": (_bool, False), "ranks": (_records(_RANK_RECORD, MAX_RANKS), False),
    # suspended by its link, cut off from the scheduler for its lease (gmux.node.cluster_fence), not by anyone
    "fenced": (_bool, False),
    # computing, started afresh, and no boundary seen (a script whose steps gmux does not see): it runs, at step 0
    "boundless": (_bool, False),
    # why a new process would not continue it (a rank of it) exactly now, in its reports' words: not moved
    "unmovable": (lambda v: _str(v, 1024), False),
    # suspended, its GPUs given to others (gmuxd parked it): rank 0's, where it resumes once they are free
    "parked_gpu": (_optional(_gpu_index), False),
}
# The scheduler's answer to each node_report: the machine's fence time. A link unanswered for that long suspends
# its cluster jobs, as the scheduler is about to count the machine lost and start them elsewhere.
REPORT_ANSWER = {"fence_s": (_pos_float, True)}


def report_fence(data: Any) -> Optional[float]:
    """The fence time a scheduler's answer to a node_report gives, or None when it carries no valid one (fields
    a later scheduler may add are left alone)."""
    if not isinstance(data, dict) or _fields({"fence_s": data.get("fence_s")}, REPORT_ANSWER):
        return None
    return float(data["fence_s"])


def _gpu_list(v):
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_RANKS:
        return f"expected a list of 1..{MAX_RANKS} GPU indices, one per rank"
    if any(_gpu_index(g) for g in v) or len(set(v)) != len(v):
        return f"{v!r} are not distinct GPU indices"
    return None


def _ranks(v):
    p = _int(v, lo=-(1 << 62))
    if p:
        return p
    if not 1 <= v <= MAX_RANKS:
        return f"{v} ranks: a job runs 1..{MAX_RANKS} ranks, one process per GPU"
    return None


def _names(max_items: int):
    def f(v):
        if not isinstance(v, list):
            return f"expected a list of names, got {type(v).__name__}"
        if len(v) > max_items:
            return f"list of {len(v)} items exceeds {max_items}"
        for i, x in enumerate(v):
            if _name(x):
                return f"item {i}: {_name(x)}"
        return None
    return f


_START = {"argv": (_argv, True), "cwd": (_exec_str, True), "env": (_env, False),
          # rank r runs on gpus[r] (distinct GPUs of this machine) and restores received checkpoint restore[r]
          "gpus": (_gpu_list, True),
          "restore": (_optional(_names(MAX_RANKS)), False), "mem": (_optional(_nonneg_int), False),
          "weight": (_optional(_weight), False), "ckpt_every": (_optional(_pos_float), False),
          "restore_wait": (_optional(_pos_float), False),
          # the job stops itself once its gmuxd has not answered it for this long (LEASE_LOST_STATUS): about when
          # the scheduler counts the machine lost and starts the job elsewhere, and two copies must not both train
          "lease_s": (_optional(_pos_float), False)}


def _start(v):
    problem = _fields(v, _START)
    if problem is None and v.get("restore") is not None and len(v["restore"]) != len(v["gpus"]):
        return f"restore: expected one received checkpoint per rank ({len(v['gpus'])})"
    return problem


# What each action carries (scheduler -> a machine's cluster link), by action.
ACTION_ARGS = {
    "start": _start,
    "suspend": {}, "kill": {}, "release": {},
    # resume: whether the source runs the job on if its send ends without a move (false: it was suspended before)
    "abandon": {"of": (_one_of("start", "send"), True), "resume": (_bool, False)},
    "resume": {"gpu": (_optional(_gpu_index), False)},
    "move": {"gpu": (_gpu_index, True)},
    "migrate_out": {"target": (_name, True), "endpoint": (_tcp_endpoint, True), "xfer": (_name, True),
                    "resume": (_bool, False)},
}
# What an event reports, whichever event it is.
EVENT_DATA = {"step": (_nonneg_int, False), "local": (_name, False), "gpu": (_gpu_index, False),
              # an action_failed's action, and whether gmuxd refused it only for now (a move or suspend under way)
              "action": (_one_of(*CLUSTER_ACTIONS), False), "busy": (_bool, False),
              "xfers": (_names(MAX_RANKS), False), "bytes": (_nonneg_int, False), "seconds": (_float, False),
              # a move's parts: suspending the ranks, writing their checkpoints, sending them
              "suspend_s": (_float, False), "checkpoint_s": (_float, False), "transfer_s": (_float, False),
              # of suspend_s, how long the job still computed before its boundary: where a move's downtime begins
              "running_s": (_float, False),
              # of bytes, how many went sealed beside Curve (gmux.wire.sealed) rather than through it
              "sealed_bytes": (_nonneg_int, False),
              # a resume refused: the GPU the job gave back while suspended, the only one it resumes on there
              "parked_gpu": (_gpu_index, False)}

CLUSTER_MESSAGES: dict[str, dict[str, tuple]] = {
    # --- a daemon's cluster link -> scheduler: its whole state, every half second (so a restarted scheduler
    #     learns everything from the next report) ---
    "node_report": {"name": (_name, True), "gpus": (_records(_GPU_RECORD, 64), True),
                    "transfer": (_tcp_endpoint, True), "jobs": (_records(_JOB_RECORD), True)},
    # --- the outcome of an action, or of something the link did on its own (a periodic checkpoint) ---
    "node_event": {"name": (_name, True), "cjob": (_name, True), "event": (_one_of(*CLUSTER_EVENTS), True),
                   "detail": (_str, False), "data": (_map(EVENT_DATA), False)},
    # --- scheduler -> link: do this to a cluster job ---
    "node_action": {"action": (_one_of(*CLUSTER_ACTIONS), True), "cjob": (_name, True),
                    "args": (_By("action", ACTION_ARGS), True)},
    # --- clients (gmux submit/ps --cluster) -> scheduler ---
    "c_submit": {"argv": (_argv, True), "cwd": (_exec_str, True), "env": (_env, False),
                 "name": (_optional(cluster_job_name_problem), False),
                 "ranks": (_ranks, False), "mem": (_optional(_nonneg_int), False),
                 "weight": (_weight, False), "ckpt_every": (_optional(_pos_float), False)},
    "c_ps": {"all": (_bool, False)},
    "c_kill": {"cjob": (_name, True)},
    # a user's hold on a job (suspended, and kept so), and the hold's end
    "c_suspend": {"cjob": (_name, True)},
    "c_resume": {"cjob": (_name, True)},
    # an operator's move (the policies move jobs on their own; this is for draining a machine, and for tests)
    # (a gang's rank r goes to GPU gpu + r of that machine)
    "c_migrate": {"cjob": (_name, True), "machine": (_name, True), "gpu": (_gpu_index, True)},
    # --- checkpoint transfer (sender DEALER -> receiver ROUTER): begin says what is coming and learns how much
    #     of it the receiver already holds (resume after a dropped connection); each chunk carries its offset,
    #     with the bytes as a second raw frame; end completes it. No checksums: CurveZMQ authenticates every
    #     message, and a checkpoint's own frames carry crc32s, checked by its reader (gmux.wire.transfer). An
    #     xfer name is never reused for different bytes: it is the identity that makes a resume safe ---
    # (seal: a fresh AES-256-GCM key for this transfer's chunks; a receiver that takes it answers with the port
    #  of its bulk socket, where the chunks then go sealed as xfer_sealed, beside Curve: gmux.wire.sealed)
    "xfer_begin": {"xfer": (_name, True), "size": (lambda v: _int(v, 0, XFER_MAX_SIZE), True),
                   "seal": (_seal_key, False)},
    # (an empty chunk appends nothing: a sender asks with it how much room a receiver has now)
    "xfer_chunk": {"xfer": (_name, True), "offset": (lambda v: _int(v, 0, XFER_MAX_SIZE), True)},
    "xfer_end": {"xfer": (_name, True),
                 "size": (lambda v: _int(v, 0, XFER_MAX_SIZE), False)},   # a stream's, known at its end
    # what the process waiting for transfer xfer already holds (reply {"holds": bytes}, empty if nothing): a
    # move's source asks before it suspends, and leaves those tensors out (gmux.job.holdings)
    "xfer_holds": {"xfer": (_name, True)},
    "reply": MESSAGES["reply"],
}

# A transfer's bulk socket (plain ZeroMQ, beside the CurveZMQ one: gmux.wire.sealed): only sealed chunks, each
# [header, AES-GCM sealed bytes] with this header as the seal's associated data, and the receiver's answers,
# replies whose data is {"nonce", "sealed"}: {"have": n[, "room": n]} or {"error": text} sealed the other way.
# Anyone may connect here, so nothing in a frame is believed before it opened with the transfer's key.
BULK_MESSAGES = {
    "xfer_sealed": {"xfer": (_name, True), "offset": (lambda v: _int(v, 0, XFER_MAX_SIZE), True),
                    "nonce": (lambda v: _int(v, 0, (1 << 62)), True)},
    "reply": MESSAGES["reply"],
}
