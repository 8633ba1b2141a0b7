"""Nothing the plugin opens can be reached from another machine, and nothing it reads from disk is unpickled.

Ranks talk over gloo sockets bound to loopback (GLOO_SOCKET_IFNAME=lo), rendezvous through a FileStore in a
private directory, and hear from the controller over inherited anonymous socket pairs; the controller
listens on nothing. Each process checks its own sockets: /proc/net/{tcp,tcp6,unix} entries whose inode is
one of /proc/self/fd's `socket:[inode]` links.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pytest_collectives

SOCKETS = '''
import os, stat

LISTEN = "0A"
LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def own_sockets():
    """inode -> fd of this process's sockets."""
    inodes = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the fd listdir itself used, closed by now
        if link.startswith("socket:["):
            inodes[link[len("socket:["):-1]] = int(fd)
    return inodes


def tcp_sockets(inodes):
    """(table, local address hex, remote address hex, state) of this process's TCP sockets."""
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    found.append((table, fields[1].split(":")[0], fields[2].split(":")[0], fields[3]))
    return found


def unix_sockets(inodes):
    """inode -> bound path ('' for an anonymous socket, '@...' for the abstract namespace)."""
    found = {}
    with open("/proc/net/unix") as f:
        for line in f.read().splitlines()[1:]:
            fields = line.split()
            if fields[6] in inodes:
                found[fields[6]] = fields[7] if len(fields) > 7 else ""
    return found
'''

MODULE = """
import multiprocessing.forkserver
import os, stat
import pytest, torch, torch.distributed as dist
from sockets import LISTEN, LOOPBACK, own_sockets, tcp_sockets, unix_sockets


@pytest.mark.world_size(2, 3)
def test_ranks_listen_on_loopback_only(pg):
    t = torch.ones(4)
    dist.all_reduce(t)  # gloo has connected every pair by now
    inodes = own_sockets()
    tcp = tcp_sockets(inodes)
    listening = [s for s in tcp if s[3] == LISTEN]
    assert listening, f"rank {pg.rank}: gloo listens somewhere, yet no LISTEN socket was found: {tcp}"
    for table, local, remote, state in tcp:
        assert local in LOOPBACK, f"rank {pg.rank}: {table} socket bound to {local} (state {state})"
        assert state == LISTEN or remote in LOOPBACK, f"rank {pg.rank}: connected to {remote}"
    assert all(path == "" for path in unix_sockets(inodes).values()), unix_sockets(inodes)


@pytest.fixture
def live_pool(request):
    # groups are stopped once no test needs their size: the ones the checks look at are started here
    pool = request.config.pluginmanager.get_plugin("collectives-session").launcher.pool
    for world_size in (2, 3):
        pool.group(world_size)
    return pool


def test_controller_listens_on_nothing_and_talks_over_anonymous_pairs(live_pool):
    inodes = own_sockets()
    tcp = tcp_sockets(inodes)
    assert not [s for s in tcp if s[3] == LISTEN], f"the controller listens on TCP: {tcp}"
    assert not tcp, f"the controller has TCP sockets: {tcp}"
    unix = unix_sockets(inodes)
    assert all(path == "" for path in unix.values()), f"the controller has a named unix socket: {unix}"
    channels = [conn.fileno() for group in live_pool.groups.values() for conn in group.conns]
    assert len(channels) == 2 + 3
    for fd in channels:
        kind = os.fstat(fd).st_mode
        link = os.readlink(f"/proc/self/fd/{fd}")
        assert stat.S_ISFIFO(kind) or (stat.S_ISSOCK(kind) and unix.get(link[len("socket:["):-1]) == ""), link


def test_rendezvous_and_forkserver_live_in_private_directories(live_pool):
    # Whoever can write the FileStore can join a group; whoever can connect to the forkserver's socket can
    # have it fork code: both must be reachable by this user only.
    places = {os.path.dirname(g.spec.store_path) for g in live_pool.groups.values()}
    places |= {os.path.dirname(p) for p in places}  # the pool's root
    places.add(os.path.dirname(multiprocessing.forkserver._forkserver._forkserver_address))
    for place in places:
        info = os.stat(place)
        assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700, (place, oct(info.st_mode))
"""


def test_every_socket_is_loopback_or_anonymous(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(sockets=SOCKETS, test_sockets=MODULE)
    # Its own process: the controller must be pytest alone, not this test session with its own sockets.
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=4)


# Unpickling runs code. Only the private controller<->rank channel (pipes to our own children) may do it;
# everything read from disk (baselines, reports) is JSON.
UNPICKLING = re.compile(
    r"\bpickle\.loads?\(|Unpickler|\bmarshal\.loads?\(|\b(c?loud)?pickle\.|\bdill\.|\bshelve\.|"
    r"\byaml\.(unsafe_)?load|\btorch\.load\(|\.recv\(\)"
)
# the pipes' ends and their messages (messages.packed pickles a task for both)
CONTROL_CHANNEL = {
    "execution/launchers/warm_groups.py",
    "execution/ranks/worker.py",
    "execution/session.py",
    "execution/messages.py",
}
PACKAGE = Path(pytest_collectives.__file__).parent


def test_only_the_control_channel_unpickles() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 5, sources
    unpickling = {
        path.relative_to(PACKAGE).as_posix(): [m.group(0) for m in UNPICKLING.finditer(path.read_text())]
        for path in sources
        if UNPICKLING.search(path.read_text())
    }
    assert set(unpickling) <= CONTROL_CHANNEL, unpickling
    channel = {"execution/launchers/warm_groups.py", "execution/ranks/worker.py"}
    assert channel <= set(unpickling), "the check sees no channel"


@pytest.mark.parametrize(
    "module",
    ["gate/store.py", "gate/baseline_format.py", "gate/choosing.py", "gate/baseline_gate.py",
     "gate/report.py", "nodereport/outputs/write.py", "nodereport/collect.py", "nodereport/fleet/reading.py",
     "nodereport/fleet/cli.py", "nodereport/fleet/write.py"],
)  # fmt: skip
def test_files_on_disk_are_json(module: str) -> None:
    path = PACKAGE / module
    tree = ast.parse(path.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}  # fmt: skip
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}  # fmt: skip
    assert not imported & {"pickle", "marshal", "shelve", "dill", "cloudpickle", "yaml"}, imported
    if module == "gate/store.py":
        assert "json" in imported
