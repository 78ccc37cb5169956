"""A neighbour's FUSE mount that names itself as root's holds no wcached
thread either: test_load_neighbour_paths' scenarios, with bob's mount made
as `fusermount3 -o subtype=<60 letters>,fsname=user_id=0` makes it (both
options any user may give). Its mountinfo line reads

    ... - fuse.aaaa...(60) user_id=0 rw,user_id=BOB,group_id=...,allow_other

a type of 65 bytes and a source that looks like root's super option: the
mount table must still be read field by field (the super options are the
last field), so the mount is bob's and the walk refuses it (README: a
model's path is walked into no user's FUSE mount).
"""
import functools

import pytest

import test_load_neighbour_paths as paths


@pytest.fixture
def spoofed(monkeypatch):
    """Bob's HangFS mounts, for the scenario run, spelled to look like
    root's."""
    monkeypatch.setattr(paths, "HangFS", functools.partial(
        paths.HangFS, source=b"user_id=0", fstype=b"fuse." + b"a" * 60))


def test_a_neighbours_mount_named_as_roots_on_the_team_directory_model_hangs_nothing(
        tmp_path, spoofed):
    """Bob's mount on m/ itself, a team directory model; the watched
    reload must refuse it, not wait on his server."""
    paths.test_a_neighbours_fuse_mount_on_the_team_directory_model_itself_hangs_nothing(
        tmp_path)


def test_a_neighbours_mount_named_as_roots_above_the_tree_hangs_nothing(tmp_path, spoofed):
    """Bob's mount on the team directory above m/."""
    paths.test_a_neighbours_fuse_mount_on_the_team_directory_above_the_tree_hangs_nothing(
        tmp_path)


def test_a_link_to_a_neighbours_file_mount_named_as_roots_hangs_nothing(tmp_path, spoofed):
    """Bob's link over a one-file model, to his file with his mount on it."""
    paths.test_a_neighbours_link_over_a_one_file_model_in_a_team_directory_hangs_nothing(
        tmp_path)


def test_wcached_check_through_a_neighbours_mount_named_as_roots_ends(tmp_path, spoofed):
    """The same link, and the operator's `wcached --check`: it ends."""
    paths.test_wcached_check_of_a_one_file_team_model_behind_a_neighbours_link_ends(tmp_path)
