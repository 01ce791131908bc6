"""The layers of DESIGN.md, enforced by reading every module's imports (ast, nothing imported to check).

`util`, `protocol` <- `rundir` <- `wire` <- `job`, `node`, `cluster` <- `cli`, `examples`. `node` and `cluster` never
import each other; the policies import nothing that does I/O (no torch, ZeroMQ, NVML, sockets); nothing outside
the job side (and the example training scripts) imports torch at module level, so `gmux ps` never pays for it.
"""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gmux")

# package -> the gmux packages it may import (itself always allowed)
ALLOWED = {
    "util": set(),
    "protocol": set(),
    "rundir": {"util"},
    "wire": {"util", "protocol", "rundir"},
    "job": {"util", "protocol", "rundir", "wire", "_native"},
    "node": {"util", "protocol", "rundir", "wire"},
    "cluster": {"util", "protocol", "rundir", "wire"},
    "cli": {"util", "protocol", "rundir", "wire", "job", "node", "cluster"},
    "examples": {"util", "protocol", "rundir", "wire", "job", "cli"},
    "_native": set(),
}
POLICY_FORBIDDEN = {"torch", "zmq", "pynvml", "socket", "sqlite3", "subprocess", "msgpack", "time", "threading"}
TORCH_ALLOWED = {"job", "examples"}


def modules():
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)
                yield rel, ast.parse(open(path).read(), path)


def imports(tree, rel):
    """(module imported, at module level?) for every import, relative ones resolved."""
    package = ["gmux"] + rel.split(os.sep)[:-1]
    func_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func_nodes.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        top = id(node) not in func_nodes
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            yield name, top
            for a in node.names:      # `from gmux import protocol`: the module is gmux.protocol
                if name == "gmux":
                    yield f"gmux.{a.name}", top


def layer(rel):
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".py") else first


ALL = list(modules())


def test_every_module_is_in_a_layer():
    unknown = sorted({layer(rel) for rel, _ in ALL} - set(ALLOWED) - {"__init__"})
    assert not unknown, f"modules outside the layers of DESIGN.md: {unknown}"


@pytest.mark.parametrize("rel,tree", ALL, ids=[rel for rel, _ in ALL])
def test_imports_go_one_way(rel, tree):
    mine = layer(rel)
    if mine == "__init__":
        return
    bad = []
    for name, top in imports(tree, rel):
        if name and name.startswith("gmux.") and name != "gmux":
            target = name.split(".")[1]
            if target != mine and target not in ALLOWED[mine]:
                bad.append(name)
        root = (name or "").split(".")[0]
        if rel.startswith(os.path.join("cluster", "policies")) and root in POLICY_FORBIDDEN:
            bad.append(f"{name} (a policy is a pure object)")
        if root == "torch" and top and mine not in TORCH_ALLOWED:
            bad.append(f"{name} at module level (only the job side imports torch)")
        if rel.startswith(os.path.join("cluster", "policies")) and name and name.startswith("gmux.") \
                and not name.startswith("gmux.cluster.policies"):
            bad.append(f"{name} (policies import only each other)")
    assert not bad, f"gmux/{rel} imports across the layers: {bad}"


@pytest.mark.parametrize("module", ["gmux.cli.gmux", "gmux.cli.gmuxd", "gmux.cli.scheduler", "gmux.cli.sim",
                                    "gmux.node.daemon", "gmux.node.cluster_link", "gmux.cluster.scheduler.service"])
def test_control_plane_never_imports_torch(module):
    code = f"import sys, {module}; bad = [m for m in ('torch', 'gmux.job') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"importing {module} pulls in {out.stdout.strip()}"


def test_no_file_over_500_lines_without_a_reason():
    long = []
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                text = open(path).read()
                if text.count("\n") > 500 and "Longer than 500 lines on purpose" not in text[:3000]:
                    long.append(f"{os.path.relpath(path, ROOT)} ({text.count(chr(10))} lines)")
    assert not long, f"files over 500 lines with no reason at their top: {long}"
