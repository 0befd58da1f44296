"""Atomic writes: complete files or none, with the permissions a plain open() would give."""

import os

import pytest

from insitu.io import atomic_write


def test_atomic_write_replaces_the_file_and_respects_the_umask(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    atomic_write(target, "one")
    atomic_write(target, b"two")
    assert target.read_text() == "two"
    old = os.umask(0o027)
    try:
        atomic_write(target, "three")
    finally:
        os.umask(old)
    assert target.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in target.parent.iterdir()] == ["out.txt"]     # no temporary left


def test_a_failed_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "out.txt"
    atomic_write(target, "kept")

    with pytest.raises(TypeError):
        atomic_write(target, 12345)
    assert target.read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_exclusive_makes_holders_of_one_lock_take_turns(tmp_path):
    """Sweep points sharing a result take turns: the second waits for the first to finish."""
    import threading
    import time

    from insitu.io import exclusive

    order = []

    def hold(name, seconds):
        with exclusive(tmp_path / "row.lock"):
            order.append(f"{name} in")
            time.sleep(seconds)
            order.append(f"{name} out")

    first = threading.Thread(target=hold, args=("a", 0.3))
    first.start()
    while not order:                                 # a holds the lock
        time.sleep(0.01)
    second = threading.Thread(target=hold, args=("b", 0.0))
    second.start()
    first.join()
    second.join()
    assert order == ["a in", "a out", "b in", "b out"]
