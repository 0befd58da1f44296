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
