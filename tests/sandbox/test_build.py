"""Building the control plane binary: cache key, version flags, a missing Go."""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path

import pytest

from gpuspawner_sandbox import build


@pytest.fixture
def module_copy(tmp_path) -> Path:
    """A copy of our Go module's source files (no Kubernetes source)."""
    dest = tmp_path / "go"
    for name in build.source_files(build.GO_MODULE_DIR):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(build.GO_MODULE_DIR / name, dest / name)
    return dest


def test_repo_holds_only_our_go_files():
    module = build.GO_MODULE_DIR
    assert not (module / "vendor").exists()
    assert sorted(p.name for p in module.iterdir() if p.is_file()) == [
        "go.mod",
        "go.sum",
        "main.go",
    ]
    assert "deviceplugin/server.go" in build.source_files(module)
    assert not [n for n in build.source_files(module) if n.endswith("_test.go")]


def test_k8s_binary_key_covers_every_package_of_ours_it_links():
    module = build.GO_MODULE_DIR
    name = build.module_path((module / "go.mod").read_text())
    linked = set()
    for source in build.source_files(module):
        if source.endswith(".go"):
            linked |= build.module_imports((module / source).read_text(), name)
    assert "deviceplugin" in linked
    assert linked <= set(build.K8S_PACKAGES)


def test_separate_programs_do_not_change_the_k8s_binary_key(module_copy):
    before = build.source_hash(module_copy)
    program = module_copy / "cmd" / "tool" / "main.go"
    program.parent.mkdir(parents=True)
    program.write_text("package main\n\nfunc main() {}\n")
    assert build.source_hash(module_copy) == before
    (module_copy / "deviceplugin" / "extra.go").write_text("package deviceplugin\n")
    assert build.source_hash(module_copy) != before


def test_module_imports_reads_import_blocks_and_single_imports():
    source = (
        "// Package x (a comment with parentheses) does things.\n"
        "package main\n\n"
        'import "m/one"\n'
        'import alias "m/two/sub"\n'
        "import (\n"
        '\t"fmt"\n'
        '\tdp "m/three"\n'
        '\t_ "m/four" // side effects\n'
        ")\n"
        'var s = "m/not-an-import"\n'
    )
    assert build.module_imports(source, "m") == {"one", "two/sub", "three", "four"}


def test_pin_is_a_recent_release_with_every_staging_module_replaced():
    go_mod = (build.GO_MODULE_DIR / "go.mod").read_text()
    version = build.kubernetes_version(go_mod)
    major, minor = (int(x) for x in version.lstrip("v").split(".")[:2])
    assert (major, minor) >= (1, 33)
    staging = f"v0.{minor}.{version.split('.')[2]}"
    for module in ("k8s.io/api", "k8s.io/apiserver", "k8s.io/client-go", "k8s.io/kube-scheduler"):
        assert f"{module} => {module} {staging}" in go_mod


def test_binary_name_carries_version_and_changes_with_the_sources(module_copy, tmp_path):
    cache = tmp_path / "cache"
    first = build.binary_path(module_copy, cache)
    assert first.parent == cache / "bin"
    version = build.kubernetes_version((module_copy / "go.mod").read_text())
    assert first.name.startswith(f"k8s-{version}-")
    assert build.binary_path(module_copy, cache) == first

    with (module_copy / "main.go").open("a") as f:
        f.write("\n// a change\n")
    second = build.binary_path(module_copy, cache)
    assert second != first

    with (module_copy / "deviceplugin" / "devices.go").open("a") as f:
        f.write("\n// a change\n")
    assert build.binary_path(module_copy, cache) != second
    third = build.binary_path(module_copy, cache)
    # Tests do not decide the binary.
    (module_copy / "deviceplugin" / "extra_test.go").write_text("package deviceplugin\n")
    assert build.binary_path(module_copy, cache) == third


def test_cached_binary_is_reused_without_go(module_copy, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    target = build.binary_path(module_copy, cache)
    target.parent.mkdir(parents=True)
    target.write_text("pretend binary")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no go anywhere
    out = io.StringIO()
    assert build.build(module_copy, cache, out=out) == target
    assert "up to date" in out.getvalue()


def test_missing_go_is_one_readable_sentence(module_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(build.GoMissing) as excinfo:
        build.build(module_copy, tmp_path / "cache", out=io.StringIO())
    assert str(excinfo.value) == build.GO_MISSING
    assert "\n" not in str(excinfo.value)


def test_main_reports_missing_go_without_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("GPUSPAWNER_SANDBOX_CACHE", str(tmp_path / "cache"))
    assert build.main([]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Go 1.26 or newer is needed")
    assert "Traceback" not in err


def test_too_old_go_is_refused(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "go"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'go version go1.22.2 linux/amd64'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(build.GoMissing, match=r"go1\.22\.2"):
        build.find_go()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("go version go1.26.8 linux/amd64", (1, 26)),
        ("go version go1.30rc1 darwin/arm64", (1, 30)),
        ("something else", None),
    ],
)
def test_parse_go_version(text, expected):
    assert build.parse_go_version(text) == expected


def test_version_ldflags_set_both_version_packages():
    flags = build.version_ldflags("v1.37.2")
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {pkg}.gitVersion=v1.37.2" in flags
        assert f"-X {pkg}.gitMajor=1" in flags
        assert f"-X {pkg}.gitMinor=37" in flags


def test_no_go_module_is_a_readable_error(tmp_path):
    with pytest.raises(build.BuildError, match="runs from a clone"):
        build.binary_path(tmp_path / "nowhere", tmp_path / "cache")


def test_progress_says_how_far_and_how_long_is_left():
    assert build.progress_line(0, None, 5) == "  still building… 0 packages compiled (5s)"
    early = build.progress_line(5, 2600, 30)
    assert "5 of at most 2600" in early and "left" not in early
    # 500 packages in 250 s: 2,100 more at that rate is 1,050 s
    assert build.progress_line(500, 2600, 250).endswith("at most about 18 min left)")
    assert build.progress_line(2590, 2600, 1000).endswith("at most about 4s left)")
    assert build.progress_line(3000, 2600, 1000).startswith(
        "  still building… 2600 of at most 2600"
    )


def test_a_second_builder_of_the_same_target_waits_for_the_first(tmp_path):
    """The suite's prebuild and a test needing the same program: one compiles, the other
    waits on the target's lock and then finds it built."""
    import threading

    target = tmp_path / "bin" / "kueue-v0.17.0"
    order: list[str] = []
    first_holds = threading.Event()

    def first() -> None:
        with build.exclusive(target):
            first_holds.set()
            time.sleep(0.3)
            order.append("first built")

    thread = threading.Thread(target=first)
    thread.start()
    first_holds.wait(5)
    with build.exclusive(target):
        order.append("second went on")
    thread.join()
    assert order == ["first built", "second went on"]
    # another target is not held up by it
    with build.exclusive(tmp_path / "bin" / "helm-v3"):
        pass


def test_the_image_cache_is_the_checkouts_unless_moved(monkeypatch, tmp_path):
    monkeypatch.delenv(build.IMAGE_CACHE_ENV, raising=False)
    assert build.image_cache_dir(tmp_path) == tmp_path / ".cache" / "images"
    monkeypatch.setenv(build.IMAGE_CACHE_ENV, str(tmp_path / "shared"))
    assert build.image_cache_dir(tmp_path) == tmp_path / "shared"
