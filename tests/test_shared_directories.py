"""Hostile neighbours: a store in a directory others can write to trusts no file it did not make.

Another user is simulated by ``chown`` to uid 65534 (``nobody``), which needs root; those tests
are skipped otherwise. Read-only media is a real read-only bind mount in a private mount
namespace (``unshare -m``), so nothing outlives the test; skipped where that is not permitted.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nous_inbox.errors import StoreError
from nous_inbox.events import MessageSent
from nous_inbox.message import Message
from nous_inbox.store import open_store

ROOT = Path(__file__).resolve().parent.parent
OTHER_UID = 65534

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def lock_path(store_path: Path, stream: str) -> Path:
    name = hashlib.sha256(stream.encode()).hexdigest()[:32]
    return Path(str(store_path) + ".owners") / f"{name}.lock"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def send(url: str, stream: str = "s", text: str = "hi") -> None:
    with open_store(url) as store:
        store.append(stream, [MessageSent(target="next_step", wakeup=True,
                                          message=Message.user(text))])


@pytest.fixture(params=["file", "sqlite"])
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_path(scheme: str, tmp_path: Path) -> Path:
    return tmp_path / ("log.jsonl" if scheme == "file" else "inbox.sqlite")


@pytest.fixture
def store_url(scheme: str, store_path: Path) -> str:
    return f"{scheme}:{store_path}"


# -- the owner lease --------------------------------------------------------------------------------


def test_a_planted_symlink_lock_file_is_refused_and_its_target_left_whole(
    store_url: str, store_path: Path, tmp_path: Path,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock = lock_path(store_path, "s")
    lock.parent.mkdir(mode=0o700)
    lock.symlink_to(victim)
    with open_store(store_url) as store, pytest.raises(StoreError, match="symbolic link"):
        store.own("s")
    assert victim.read_text() == "precious\n"


def test_a_planted_symlink_lock_file_never_changes_its_targets_mode(
    store_url: str, store_path: Path, tmp_path: Path,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    lock = lock_path(store_path, "s")
    lock.parent.mkdir(mode=0o700)
    lock.symlink_to(victim)
    with open_store(store_url) as store, pytest.raises(StoreError):
        store.own("s")
    assert mode(victim) == 0o644 and victim.read_text() == "precious\n"


def test_a_lease_directory_that_is_a_symlink_is_refused(
    store_url: str, store_path: Path, tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    Path(str(store_path) + ".owners").symlink_to(elsewhere)
    with open_store(store_url) as store, pytest.raises(StoreError, match="symbolic link"):
        store.own("s")
    assert list(elsewhere.iterdir()) == []


def test_a_lease_directory_others_may_write_to_is_refused(
    store_url: str, store_path: Path,
) -> None:
    owners = Path(str(store_path) + ".owners")
    owners.mkdir()
    owners.chmod(0o777)
    with open_store(store_url) as store, pytest.raises(StoreError, match=r"writable by group and others \(mode 0777\).*chmod 700"):
        store.own("s")


def test_our_own_lease_directory_is_tightened_to_0700(store_url: str, store_path: Path) -> None:
    owners = Path(str(store_path) + ".owners")
    owners.mkdir()
    owners.chmod(0o755)
    with open_store(store_url) as store, store.own("s"):
        assert mode(owners) == 0o700
        assert mode(lock_path(store_path, "s")) == 0o600


@as_root
def test_a_lease_directory_another_user_owns_is_refused(store_url: str, store_path: Path) -> None:
    owners = Path(str(store_path) + ".owners")
    owners.mkdir(mode=0o700)
    os.chown(owners, OTHER_UID, OTHER_UID)
    with open_store(store_url) as store, pytest.raises(StoreError, match="belongs to uid 65534"):
        store.own("s")


@as_root
def test_a_lock_file_another_user_owns_is_refused_untouched(store_url: str, store_path: Path) -> None:
    lock = lock_path(store_path, "s")
    lock.parent.mkdir(mode=0o700)
    lock.write_text("theirs\n")
    lock.chmod(0o644)
    os.chown(lock, OTHER_UID, OTHER_UID)
    with open_store(store_url) as store, pytest.raises(StoreError, match=r"lock file .* belongs to uid 65534"):
        store.own("s")
    assert lock.read_text() == "theirs\n" and mode(lock) == 0o644


def test_a_lock_file_others_may_write_to_is_refused(store_url: str, store_path: Path) -> None:
    lock = lock_path(store_path, "s")
    lock.parent.mkdir(mode=0o700)
    lock.write_text("")
    lock.chmod(0o666)
    with open_store(store_url) as store, pytest.raises(StoreError, match=r"lock file .* writable"):
        store.own("s")


# -- store files --------------------------------------------------------------------------------


@as_root
@pytest.mark.parametrize("read_only", [False, True])
def test_a_store_file_another_user_owns_is_refused(
    store_url: str, store_path: Path, read_only: bool,
) -> None:
    send(store_url, text="real")
    os.chown(store_path, OTHER_UID, OTHER_UID)
    with pytest.raises(StoreError, match=r"belongs to uid 65534, not to you .*chown"):
        open_store(store_url, read_only=read_only)


@pytest.mark.parametrize("planted", [0o666, 0o664, 0o646])
@pytest.mark.parametrize("read_only", [False, True])
def test_a_store_file_others_may_write_to_is_refused_saying_how_to_fix_it(
    store_url: str, store_path: Path, planted: int, read_only: bool,
) -> None:
    send(store_url)
    store_path.chmod(planted)
    with pytest.raises(StoreError, match=rf"is writable by .*\(mode 0{planted:o}\).*`chmod 600 "):
        open_store(store_url, read_only=read_only)
    assert mode(store_path) == planted  # refused untouched


def test_our_own_store_file_is_tightened_to_0600_when_opened_for_writing(
    store_url: str, store_path: Path,
) -> None:
    send(store_url)
    store_path.chmod(0o644)
    with open_store(store_url, read_only=True):
        assert mode(store_path) == 0o644  # a reader changes nothing
    with open_store(store_url) as store:
        assert store.version("s") == 1
    assert mode(store_path) == 0o600


def test_an_empty_file_made_with_the_umask_is_tightened(store_url: str, store_path: Path) -> None:
    store_path.write_bytes(b"")
    store_path.chmod(0o644)
    send(store_url)
    assert mode(store_path) == 0o600


def test_sqlite_companions_of_ours_are_tightened_and_planted_ones_refused(tmp_path: Path) -> None:
    path = tmp_path / "inbox.sqlite"
    url = f"sqlite:{path}"
    with open_store(url) as first:  # an open writer keeps -wal and -shm in place
        first.append("s", [MessageSent(target="next_step", wakeup=True, message=Message.user("a"))])
        wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
        assert wal.exists() and shm.exists()
        wal.chmod(0o644)
        shm.chmod(0o644)
        with open_store(url) as second:
            assert second.version("s") == 1
        assert mode(wal) == 0o600 and mode(shm) == 0o600
        shm.chmod(0o666)
        with pytest.raises(StoreError, match=r"-shm is writable by group and others"):
            open_store(url)


@as_root
def test_a_sqlite_wal_another_user_owns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "inbox.sqlite"
    send(f"sqlite:{path}")
    wal = Path(f"{path}-wal")
    wal.write_bytes(b"")
    os.chown(wal, OTHER_UID, OTHER_UID)
    with pytest.raises(StoreError, match=r"-wal belongs to uid 65534"):
        open_store(f"sqlite:{path}")


def test_a_sqlite_companion_that_is_a_symlink_is_refused_and_its_target_left_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "inbox.sqlite"
    send(f"sqlite:{path}")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    Path(f"{path}-wal").symlink_to(victim)
    with pytest.raises(StoreError, match=r"-wal is a symbolic link"):
        open_store(f"sqlite:{path}")
    assert victim.read_text() == "precious\n"


def test_sqlite_companions_are_checked_next_to_the_file_a_link_names(tmp_path: Path) -> None:
    real = tmp_path / "real" / "inbox.sqlite"
    real.parent.mkdir()
    send(f"sqlite:{real}")
    link = tmp_path / "inbox.sqlite"
    link.symlink_to(real)
    shm = Path(f"{real}-shm")  # where SQLite keeps it: next to the real file, not the link
    shm.write_bytes(b"")
    shm.chmod(0o666)
    with pytest.raises(StoreError, match=r"real/inbox\.sqlite-shm is writable by group"):
        open_store(f"sqlite:{link}")


def test_a_store_file_with_another_name_is_refused_for_writing(
    store_url: str, store_path: Path, tmp_path: Path,
) -> None:
    send(store_url)
    other = tmp_path / "elsewhere"
    os.link(store_path, other)  # a hard link: writing one name changes the other file
    before = other.read_bytes()
    with pytest.raises(StoreError, match=r"has 2 names \(hard links\)"):
        send(store_url, text="more")
    assert other.read_bytes() == before
    with open_store(store_url, read_only=True) as store:  # reading changes nothing: allowed
        assert store.version("s") == 1


def test_a_lock_file_with_another_name_is_refused_untouched(
    store_url: str, store_path: Path, tmp_path: Path,
) -> None:
    send(store_url)
    lock = lock_path(store_path, "s")
    lock.parent.mkdir(mode=0o700, exist_ok=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o640)
    os.link(victim, lock)  # planted: the lease would truncate and chmod it
    with open_store(store_url) as store, pytest.raises(StoreError, match=r"has 2 names"):
        store.own("s")
    assert victim.read_text() == "precious\n" and mode(victim) == 0o640


@as_root
def test_a_symlink_another_user_planted_at_the_store_path_is_refused(
    store_url: str, store_path: Path, tmp_path: Path,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("")
    store_path.symlink_to(victim)
    os.lchown(store_path, OTHER_UID, OTHER_UID)
    with pytest.raises(StoreError, match="symbolic link made by uid 65534"):
        send(store_url)
    assert victim.read_text() == ""


def test_a_symlink_of_our_own_to_a_store_is_followed(
    store_url: str, store_path: Path, scheme: str, tmp_path: Path,
) -> None:
    send(store_url, text="real")
    link = tmp_path / "link"
    link.symlink_to(store_path)
    with open_store(f"{scheme}:{link}", read_only=True) as store:
        assert store.version("s") == 1


# -- things that are not files ----------------------------------------------------------------


def run_cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "nous_inbox", *argv], capture_output=True,
                          text=True, env=env, timeout=timeout)


@pytest.mark.parametrize("prefix", ["sqlite:", "file:", ""])
def test_a_fifo_at_a_store_path_is_refused_without_hanging(prefix: str, tmp_path: Path) -> None:
    fifo = tmp_path / "inbox.sqlite"
    os.mkfifo(fifo)
    rest = {"show": ["s"], "log": ["s"], "sessions": [], "steer": ["s", "x"]}
    for command, args in rest.items():
        done = run_cli(command, "--store", f"{prefix}{fifo}", *args)
        assert done.returncode == 1, done
        assert "FIFO" in done.stderr or "not a regular file" in done.stderr, done.stderr
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_at_a_sqlite_companion_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "inbox.sqlite"
    send(f"sqlite:{path}")
    os.mkfifo(f"{path}-wal")
    with pytest.raises(StoreError, match=r"-wal is a FIFO"):
        open_store(f"sqlite:{path}", read_only=True)


# -- read-only media ----------------------------------------------------------------------------


def _read_only_mounts_work() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind -o ro / /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(not _read_only_mounts_work(),
                                 reason="needs a read-only bind mount (root in a mount namespace)")


@needs_mount
def test_a_sqlite_store_on_read_only_media_can_be_read(tmp_path: Path) -> None:
    media = tmp_path / "media"
    media.mkdir()
    path = media / "inbox.sqlite"
    send(f"sqlite:{path}", "s", "hello from the archive")
    assert sorted(p.name for p in media.iterdir()) == ["inbox.sqlite"]  # closed cleanly
    url = f"sqlite:{path}"
    script = (
        f"mount --bind -o ro {media} {media} && touch {media}/probe 2>/dev/null && exit 99; "
        f"for cmd in 'show {url} s' 'log {url} s' 'sessions {url}'; do "
        f"  set -- $cmd; c=$1; u=$2; shift 2; "
        f"  {sys.executable} -m nous_inbox $c --store $u \"$@\" || exit $?; done"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr  # 99 would mean the mount was not read-only
    assert "hello from the archive" in done.stdout
    assert "s\t1 events" in done.stdout
    assert sorted(p.name for p in media.iterdir()) == ["inbox.sqlite"]
