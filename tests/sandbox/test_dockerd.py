"""The private Docker engine's own bookkeeping (the engine itself runs in tests/images)."""

from __future__ import annotations

from gpuspawner_sandbox import dockerd


def test_the_shims_socket_directory_is_the_one_containerd_hard_codes():
    assert [str(p) for p in dockerd.SHIM_SOCKET_DIRS] == ["/run/containerd", "/run/containerd/s"]


def test_only_missing_directories_are_remembered(tmp_path):
    (tmp_path / "there").mkdir()
    paths = (tmp_path / "there", tmp_path / "gone", tmp_path / "gone" / "s")
    assert dockerd.missing_dirs(paths) == [tmp_path / "gone", tmp_path / "gone" / "s"]


def test_created_directories_go_deepest_first_and_only_while_empty(tmp_path):
    made = [tmp_path / "run", tmp_path / "run" / "s"]
    (tmp_path / "run" / "s").mkdir(parents=True)
    assert dockerd.remove_empty_dirs(made) == []
    assert not (tmp_path / "run").exists()

    # something else put a file there since: kept, with its parent, nothing removed
    (tmp_path / "run" / "s").mkdir(parents=True)
    (tmp_path / "run" / "s" / "sock").write_text("")
    assert dockerd.remove_empty_dirs(made) == [tmp_path / "run" / "s", tmp_path / "run"]
    assert (tmp_path / "run" / "s" / "sock").exists()
    # already gone is fine
    assert dockerd.remove_empty_dirs([tmp_path / "never"]) == []
