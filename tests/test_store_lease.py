"""Owner leases: one owner per stream, across store instances, threads and real processes.

What is promised: while a lease is held, any other ``own`` of the stream on the same log raises
``StreamOwnedError`` naming the stream and the holder's pid; ``release`` (idempotent), the end of a
``with`` block, closing the store, and the death of the holding process (even by SIGKILL) each
free it; leases of different streams are independent; the sidecar files are private.

``NOUS_INBOX_STRESS=N`` (an integer, default 1) multiplies the rounds of the racing tests.
"""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from nous_inbox.errors import ConcurrencyError, StreamOwnedError
from nous_inbox.events import Warned
from nous_inbox.store import OwnerLease, open_store
from nous_inbox.store.lease import take_lock_file

STRESS = int(os.environ.get("NOUS_INBOX_STRESS", "1") or 1)
ROOT = Path(__file__).resolve().parent.parent
DURABLE = ["file", "sqlite"]


def lock_file(url: str, stream: str) -> Path:
    path = os.path.realpath(url.split(":", 1)[1])
    name = hashlib.sha256(stream.encode()).hexdigest()[:32]
    return Path(f"{path}.owners") / f"{name}.lock"


# -- in one process ------------------------------------------------------------------------------


def test_a_second_own_of_a_held_stream_is_refused_naming_stream_and_pid(store, url):
    lease = store.own("s")
    assert isinstance(lease, OwnerLease) and lease.stream == "s" and not lease.released
    with pytest.raises(StreamOwnedError) as info:
        store.own("s")
    assert str(info.value) == f"another owner holds stream 's' of {url} (pid {os.getpid()})"
    assert info.value.stream == "s" and info.value.pid == os.getpid()
    assert isinstance(info.value, ConcurrencyError)
    lease.release()


def test_a_released_stream_can_be_owned_again_and_release_is_idempotent(store):
    lease = store.own("s")
    lease.release()
    lease.release()
    assert lease.released and repr(lease) == "OwnerLease('s', released)"
    with store.own("s") as again:
        assert repr(again) == "OwnerLease('s', held)"
    assert again.released
    store.own("s").release()


def test_leases_on_different_streams_are_independent(store):
    with store.own("a"), store.own("b"), pytest.raises(StreamOwnedError, match="stream 'a'"):
        store.own("a")
    store.own("a").release()


def test_owning_needs_no_lease_to_append(store):
    with store.own("s"):
        store.append("s", [Warned(text="a message from someone else")])
        assert store.version("s") == 1


def test_closing_the_store_releases_its_leases(url):
    store = open_store(url)
    lease = store.own("s")
    store.close()
    assert lease.released
    lease.release()
    with pytest.raises(ValueError, match="closed"):
        store.own("s")
    if url != "memory:":
        with open_store(url) as other:
            other.own("s").release()


def test_bad_stream_names_are_refused(store):
    with pytest.raises(ValueError, match="stream name"):
        store.own("a\nb")
    with pytest.raises(ValueError, match="stream name"):
        store.own("")


@pytest.mark.parametrize("kind", DURABLE)
def test_another_store_on_the_same_log_is_refused(url):
    with open_store(url) as first, open_store(url) as second:
        with first.own("s"):
            with pytest.raises(StreamOwnedError, match=f"pid {os.getpid()}"):
                second.own("s")
            second.own("t").release()
        with second.own("s"), pytest.raises(StreamOwnedError):
            first.own("s")


@pytest.mark.parametrize("kind", DURABLE)
def test_a_symlink_to_the_log_shares_its_leases(url, tmp_path):
    path = url.split(":", 1)[1]
    open_store(url).close()
    link = tmp_path / "link"
    link.symlink_to(path)
    kind = url.split(":", 1)[0]
    with (open_store(url) as store, open_store(f"{kind}:{link}") as via_link, store.own("s"),
          pytest.raises(StreamOwnedError)):
        via_link.own("s")


def test_memory_stores_are_separate_so_are_their_leases():
    with open_store("memory:") as a, open_store("memory:") as b, a.own("s"):
        b.own("s").release()


def test_threads_racing_for_a_stream_get_exactly_one_lease(kind, url):
    shared = open_store(url)
    threads = 4
    # One store per thread for the durable stores (the cross-instance case); memory: shares one.
    stores = [shared if kind == "memory" else open_store(url) for _ in range(threads)]
    barrier = threading.Barrier(threads)
    for round_ in range(10 * STRESS):
        won: list[OwnerLease] = []
        refused: list[StreamOwnedError] = []

        def race(store, won=won, refused=refused, stream=f"s{round_ % 3}"):
            barrier.wait()
            try:
                won.append(store.own(stream))
            except StreamOwnedError as exc:
                refused.append(exc)

        workers = [threading.Thread(target=race, args=(s,)) for s in stores]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert (len(won), len(refused)) == (1, threads - 1)
        won[0].release()
    for s in {id(s): s for s in stores}.values():
        s.close()


# -- files ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", DURABLE)
def test_lease_files_are_private_hold_the_pid_and_go_on_release(url):
    old = os.umask(0o022)
    try:
        with open_store(url) as store:
            lease = store.own("séance ✓")
            path = lock_file(url, "séance ✓")
            assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert path.read_text() == f"{os.getpid()}\n"
            lease.release()
            assert not path.exists()
    finally:
        os.umask(old)


@pytest.mark.parametrize("kind", DURABLE)
def test_a_holder_whose_pid_is_unknown_is_still_named_as_another_owner(url):
    import fcntl

    with open_store(url) as store:
        store.own("s").release()  # creates the lease directory
        path = lock_file(url, "s")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # a holder that wrote no pid yet
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with pytest.raises(StreamOwnedError) as info:
                store.own("s")
            assert str(info.value) == f"another owner holds stream 's' of {url}"
            assert info.value.pid is None
        finally:
            os.close(fd)
        store.own("s").release()


def test_a_lock_on_a_file_unlinked_or_replaced_meanwhile_does_not_count(tmp_path):
    path = tmp_path / "x.lock"
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for replace in (False, True):
            path.write_text("")
            fd = os.open(path, os.O_RDWR)
            try:
                path.unlink()
                if replace:
                    path.write_text("")
                assert take_lock_file(fd, directory, "x.lock") is False
            finally:
                os.close(fd)
        fd = os.open(path, os.O_RDWR)
        try:
            assert take_lock_file(fd, directory, "x.lock") is True
        finally:
            os.close(fd)
    finally:
        os.close(directory)


# -- across processes ----------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys
    from nous_inbox.store import open_store
    store = open_store(sys.argv[1])
    lease = store.own(sys.argv[2])
    print("held", flush=True)
    sys.stdin.readline()
    lease.release()
    print("released", flush=True)
    sys.stdin.readline()
""")


def _holder(url: str, stream: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, url, stream], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line != "held\n":
        proc.kill()
        raise AssertionError(f"holder failed: {proc.communicate()[1]}")
    return proc


def _finish(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=30)


@pytest.mark.parametrize("kind", DURABLE)
def test_a_lease_held_by_another_process_is_refused_until_it_releases(url):
    open_store(url).close()
    proc = _holder(url, "s")
    try:
        with open_store(url) as store:
            with pytest.raises(StreamOwnedError) as info:
                store.own("s")
            assert str(info.value) == f"another owner holds stream 's' of {url} (pid {proc.pid})"
            assert info.value.pid == proc.pid
            store.own("other").release()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("release\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "released\n"
            store.own("s").release()
    finally:
        _finish(proc)


@pytest.mark.parametrize("kind", DURABLE)
def test_a_lease_held_by_a_process_killed_with_sigkill_is_free(url):
    open_store(url).close()
    proc = _holder(url, "s")
    try:
        with open_store(url) as store:
            with pytest.raises(StreamOwnedError):
                store.own("s")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            with store.own("s"):  # the stale file, with the dead pid in it, is taken over
                assert lock_file(url, "s").read_text() == f"{os.getpid()}\n"
    finally:
        _finish(proc)


RACER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from nous_inbox.errors import StreamOwnedError
    from nous_inbox.store import open_store
    url, counter, rounds = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    store = open_store(url)
    won = 0
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(rounds):
        try:
            lease = store.own("s")
        except StreamOwnedError:
            continue
        # A read-modify-write that only mutual exclusion keeps exact.
        counter.write_text(str(int(counter.read_text()) + 1))
        won += 1
        lease.release()
    print(won, flush=True)
""")


@pytest.mark.parametrize("kind", DURABLE)
def test_processes_racing_to_own_never_hold_a_stream_together(url, tmp_path):
    open_store(url).close()
    counter = tmp_path / "counter"
    counter.write_text("0")
    rounds = 150 * STRESS
    procs = [subprocess.Popen([sys.executable, "-c", RACER, url, str(counter), str(rounds)],
                              cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for _ in range(3)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        won = 0
        for proc in procs:
            assert proc.stdout is not None
            won += int(proc.stdout.readline())
    finally:
        for proc in procs:
            _finish(proc)
    assert won > 0
    assert int(counter.read_text()) == won  # no two ever held it at once
