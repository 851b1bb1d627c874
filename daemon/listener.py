"""The listening Unix socket, and who can reach it: a stale socket file is removed, a live one refused.

Rule kept here: the socket is 0600 in a 0700 folder (only the daemon's user can connect) unless
`allowed_uids` lets other uids in; those uids can reach it only through a group, so `allowed_uids`
needs `socket_group`, a group every listed uid is in, and then the socket is 0660 and its own
folder 0710 (search only), both in that group. Mode bits alone cannot grant one uid, and the daemon
never opens the socket to every user. What cannot work is refused at start, before recovery, with
the reason: `allowed_uids` without `socket_group` (or the reverse), an unknown group, a listed uid
not in it (by the user and group databases), or a folder on the way that a listed uid may not
search (by its mode bits; ACLs are not read). The daemon changes only the socket's own folder: one
it makes, or one of its user's that holds nothing but the socket; any other folder on the path must
already let the listed uids through. Under socket activation the .socket unit's SocketMode= and
SocketGroup= decide instead, and none of this applies (SO_PEERCRED still does, daemon/accept.py).
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import socket as stdlib_socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import StartupError

log = logging.getLogger("eurekamem")

PRIVATE_FOLDER, PRIVATE_SOCKET = 0o700, 0o600  # the daemon's user alone
GROUP_FOLDER, GROUP_SOCKET = 0o710, 0o660  # and socket_group: through the folder (no listing), onto the socket


@dataclass(frozen=True)
class SocketAccess:
    """Who the socket is opened to: gid None is the daemon's user alone."""

    gid: int | None = None
    group: str = ""


def _activated() -> bool:
    """Is a socket passed by socket activation (LISTEN_PID is this process)? The listener then is not ours."""
    return os.environ.get("LISTEN_PID") == str(os.getpid()) and bool(os.environ.get("LISTEN_FDS"))


def _group_of(name: str) -> grp.struct_group:
    try:
        return grp.getgrgid(int(name)) if name.isdigit() else grp.getgrnam(name)
    except KeyError:
        raise StartupError(f"socket_group {name!r}: no such group") from None


def _gids_of(uid: int) -> set[int] | None:
    """The groups the user and group databases put `uid` in (None: no such user)."""
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return None
    return set(os.getgrouplist(user.pw_name, user.pw_gid))


def _may_search(st: os.stat_result, uid: int, gids: set[int]) -> bool:
    """May `uid` (in `gids`) pass through the folder `st`, by its mode bits?"""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in gids:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _own_folder(folder: Path, socket_name: str) -> bool:
    """Is `folder` the socket's own: missing (the daemon makes it), or its user's holding nothing but the socket?"""
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return True
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and set(os.listdir(folder)) <= {socket_name}


def socket_access(config: Any) -> SocketAccess:
    """Whom the socket at config.socket_path is opened to, from allowed_uids and socket_group;
    StartupError saying why and what to do when the listed uids could not connect."""
    uids = sorted(set(config.allowed_uids) - {os.getuid()})  # the daemon's own uid is let in anyway
    name = str(config.socket_group)
    if _activated():
        return SocketAccess()
    if not name:
        if uids:
            raise StartupError(
                f"allowed_uids {uids} has no effect alone: the socket is 0600 in a 0700 folder, which no other uid can "
                "reach. Set socket_group to a group every listed uid is in (the socket becomes 0660 and its folder "
                "0710 in that group), or drop allowed_uids"
            )
        return SocketAccess()
    if not uids:
        raise StartupError(
            f"socket_group {name!r} opens the socket to that group, but only the daemon's own uid and allowed_uids may "
            "connect (allowed_uids is empty): list the uids in allowed_uids, or drop socket_group"
        )
    group = _group_of(name)
    gid = group.gr_gid
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise StartupError(
            f"socket_group {group.gr_name!r} (gid {gid}): the daemon's user is not in it, and a process may give its "
            "socket only to a group it is in"
        )
    groups_of: dict[int, set[int]] = {}
    outside = []
    for uid in uids:
        gids = _gids_of(uid)
        if gids is None:
            outside.append(f"uid {uid} (no such user: it is in no group the daemon can see)")
        elif uid != 0 and gid not in gids:
            outside.append(f"uid {uid}")
        else:
            groups_of[uid] = gids
    if outside:
        raise StartupError(
            f"allowed_uids: {', '.join(outside)} not in socket_group {group.gr_name!r} (gid {gid}), so the socket "
            "(0660 in that group) stays out of reach: add them to the group, or choose a group they are all in"
        )
    path = Path(config.socket_path).absolute()
    own = _own_folder(path.parent, path.name)
    folders = list(path.parents)
    for folder in folders[1:] if own else folders:  # the socket's own folder is made 0710 in the group
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            continue  # made by the daemon with the socket's own folder (0710 in the group too)
        for uid, gids in groups_of.items():
            if not _may_search(st, uid, gids):
                raise StartupError(
                    f"allowed_uids: uid {uid} cannot reach the socket {path}: the folder {folder} (mode "
                    f"{stat.filemode(st.st_mode)}, uid {st.st_uid}, gid {st.st_gid}) does not let it through, and the "
                    "daemon changes only the socket's own folder; put the socket (--socket) in a folder of its own "
                    "whose parents the listed uids may pass (not inside the data root, which is private)"
                )
    return SocketAccess(gid, group.gr_name)


def _make_folders(folder: Path, access: SocketAccess) -> None:
    """The socket's own folder (and any missing parents: they are made as it is), with the access's mode and group."""
    missing = [f for f in [folder, *folder.parents] if not f.exists()]
    for made in reversed(missing):
        made.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
        _set_folder(made, access)
    if not missing and _own_folder(folder, ""):
        _set_folder(folder, access)


def _set_folder(folder: Path, access: SocketAccess) -> None:
    if access.gid is None:
        os.chmod(folder, PRIVATE_FOLDER)
    else:
        os.chown(folder, -1, access.gid)
        os.chmod(folder, GROUP_FOLDER)


def socket_is_live(path: Path) -> bool:
    probe = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


async def open_listener(path: Path, access: SocketAccess | None = None) -> stdlib_socket.socket:
    """A listening Unix socket at path: 0600 in a 0700 folder, or 0660 in a 0710 folder of the
    access's group; a stale socket file is removed, a live one refused."""
    access = access or SocketAccess()
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StartupError(f"{path} exists and is not a socket; refusing to replace it")
        if socket_is_live(path):
            raise StartupError(f"a daemon is already answering on {path}")
        os.unlink(path)
        log.info("removed the stale socket %s", path)
    _make_folders(path.parent, access)
    sock = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    if access.gid is not None:
        os.chown(path, -1, access.gid)  # the group first: never group-readable in another group
        os.chmod(path, GROUP_SOCKET)
        log.info("socket %s: mode 0660 in group %s (gid %d) for allowed_uids", path, access.group, access.gid)
    else:
        os.chmod(path, PRIVATE_SOCKET)
    sock.listen(1024)
    sock.setblocking(False)
    return sock
