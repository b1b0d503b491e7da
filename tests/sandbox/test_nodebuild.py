"""Building the real nodes' containerd, CNI plugins and image programs: commands and cache keys."""

from __future__ import annotations

import dataclasses

from gpuspawner_sandbox import nodebuild


def test_go_install_commands_use_the_modules_own_pin_and_tags():
    cmds = nodebuild.install_commands("go", nodebuild.CONTAINERD)
    first, shim = cmds
    assert first[:2] == ["go", "install"] and "-trimpath" in first
    assert "github.com/containerd/containerd/v2/cmd/containerd@v2.4.2" in first
    assert "github.com/containerd/containerd/v2/cmd/ctr@v2.4.2" in first
    assert any("version.Version=v2.4.2" in a for a in first if a.startswith("-ldflags="))
    assert not any(a.startswith("-tags=") for a in first)
    assert "-tags=no_grpc" in shim
    assert shim[-1] == "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@v2.4.2"
    assert nodebuild.CONTAINERD.binaries == ("containerd", "ctr", "containerd-shim-runc-v2")
    assert nodebuild.CNI_PLUGINS.binaries == ("bridge", "host-local", "loopback")


def test_cache_directory_changes_with_the_pin(tmp_path):
    here = nodebuild.tool_dir(nodebuild.CNI_PLUGINS, tmp_path)
    bumped = dataclasses.replace(nodebuild.CNI_PLUGINS, version="v1.11.0")
    assert here.parent == tmp_path / "bin"
    assert here.name.startswith("cni-plugins-v1.10.0-")
    assert nodebuild.tool_dir(bumped, tmp_path).name.startswith("cni-plugins-v1.11.0-")
    assert nodebuild.tool_hash(bumped) != nodebuild.tool_hash(nodebuild.CNI_PLUGINS)


def test_image_programs_key_covers_their_sources(tmp_path):
    module = tmp_path / "mod"
    (module / "pause").mkdir(parents=True)
    (module / "go.mod").write_text("module x\n")
    (module / "pause" / "main.go").write_text("package main\n")
    before = nodebuild.images_source_hash(module)
    (module / "pause" / "main.go").write_text("package main // changed\n")
    assert nodebuild.images_source_hash(module) != before


def test_a_cached_tool_is_not_rebuilt(tmp_path, monkeypatch):
    target = nodebuild.tool_dir(nodebuild.CNI_PLUGINS, tmp_path)
    target.mkdir(parents=True)
    for name in nodebuild.CNI_PLUGINS.binaries:
        (target / name).write_text("")

    def no_go():
        raise AssertionError("Go must not run for a cached tool")

    monkeypatch.setattr(nodebuild.build, "find_go", no_go)
    assert nodebuild.build_tool(nodebuild.CNI_PLUGINS, tmp_path) == target


def test_go_arch_names():
    assert nodebuild.go_arch("x86_64") == "amd64"
    assert nodebuild.go_arch("aarch64") == "arm64"


def test_the_dcgm_exporter_is_keyed_by_the_packages_it_links():
    files = nodebuild.module_program_files(nodebuild.DCGM_EXPORTER)
    assert files[:2] == ["go.mod", "go.sum"]
    for name in (
        "cmd/dcgm-exporter/main.go",
        "dcgm/exposition.go",
        "gpuusage/gpuusage.go",
        "podresources/podresources.go",
        "deviceplugin/driverstate.go",
    ):
        assert name in files
    # Not the k8s binary's main package, and no tests.
    assert "main.go" not in files
    assert not [f for f in files if f.endswith("_test.go")]


def _module(tmp_path):
    module = tmp_path / "mod"
    for directory in ("cmd/prog", "lib", "other"):
        (module / directory).mkdir(parents=True)
    (module / "go.mod").write_text("module example.org/m\n\ngo 1.26\n")
    (module / "go.sum").write_text("")
    (module / "cmd/prog/main.go").write_text(
        'package main\n\nimport (\n\t"fmt"\n\n\t"example.org/m/lib"\n)\n'
    )
    (module / "lib/lib.go").write_text('package lib\n\nimport "example.org/m/lib2"\n')
    (module / "lib2").mkdir()
    (module / "lib2/lib2.go").write_text("package lib2\n")
    (module / "other/other.go").write_text("package other\n")
    return module


def test_a_module_programs_key_follows_its_imports_transitively(tmp_path):
    module = _module(tmp_path)
    assert nodebuild.module_program_files("prog", module) == [
        "go.mod",
        "go.sum",
        "cmd/prog/main.go",
        "lib/lib.go",
        "lib2/lib2.go",
    ]
    before = nodebuild.module_program_path("prog", module, tmp_path)
    assert before.name == "prog" and before.parent.name.startswith("prog-")
    (module / "other/other.go").write_text("package other // changed\n")
    assert nodebuild.module_program_path("prog", module, tmp_path) == before
    (module / "lib2/lib2.go").write_text("package lib2 // changed\n")
    assert nodebuild.module_program_path("prog", module, tmp_path) != before


def test_a_cached_module_program_is_not_rebuilt(tmp_path, monkeypatch):
    module = _module(tmp_path)
    target = nodebuild.module_program_path("prog", module, tmp_path)
    target.parent.mkdir(parents=True)
    target.write_text("")

    def no_go():
        raise AssertionError("Go must not run for a cached program")

    monkeypatch.setattr(nodebuild.build, "find_go", no_go)
    assert nodebuild.build_module_program("prog", module, tmp_path) == target
