"""Building the real nodes' containerd, CNI plugins and image programs: commands and cache keys."""

from __future__ import annotations

import dataclasses

from gpuspawner_sandbox import build, gpudriver, nodebuild


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


def _smi_module(tmp_path):
    module = tmp_path / "mod"
    for package in (*nodebuild.SMI_PACKAGES, "deviceplugin"):
        (module / package).mkdir(parents=True)
        (module / package / "x.go").write_text("package x\n")
    (module / "go.mod").write_text("module x\n")
    (module / "go.sum").write_text("")
    return module


def test_nvidia_smi_key_covers_its_packages_only(tmp_path):
    module = _smi_module(tmp_path)
    before = nodebuild.smi_source_hash(module)
    (module / "deviceplugin" / "x.go").write_text("package x // the k8s binary's\n")
    (module / "nvidiasmi" / "x_test.go").write_text("package x\n")
    assert nodebuild.smi_source_hash(module) == before
    (module / "nvidiasmi" / "capture.json").write_text("{}")
    assert nodebuild.smi_source_hash(module) != before
    assert nodebuild.smi_dir(module, tmp_path).parent == tmp_path / "bin"


def test_nvidia_smi_is_not_part_of_the_k8s_binary():
    linked = build.source_files(build.GO_MODULE_DIR)
    assert not [f for f in linked if f.startswith(nodebuild.SMI_PACKAGES)]


def test_nvidia_smi_learns_the_layout_from_gpudriver():
    flags = nodebuild.smi_ldflags().split(" ")
    assert f"main.viewRoot={gpudriver.CONTAINER_VIEW_ROOT}" in flags
    assert f"main.gpuFile={gpudriver.GPU_VIEW_FILE}" in flags
    assert f"main.emulatedRootEnv={gpudriver.EMULATED_ROOT_ENV}" in flags


def test_go_arch_names():
    assert nodebuild.go_arch("x86_64") == "amd64"
    assert nodebuild.go_arch("aarch64") == "arm64"


def test_nvidias_toolkit_is_built_with_cgo_and_its_own_pin():
    tool = nodebuild.NVIDIA_TOOLKIT
    assert tool in nodebuild.NODE_TOOLS
    assert tool.binaries == ("nvidia-container-runtime", "nvidia-cdi-hook", "nvidia-ctk")
    (cmd,) = nodebuild.install_commands("go", tool)
    assert "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime@v1.20.2" in cmd
    # go-nvml needs cgo (NVML itself is only loaded at run time); the others are static.
    assert tool.cgo and nodebuild._go_env(tool.cgo)["CGO_ENABLED"] == "1"
    assert not nodebuild.CONTAINERD.cgo and nodebuild._go_env()["CGO_ENABLED"] == "0"
    # cgo is part of the cache key, but leaves the static tools' keys as they were.
    static = dataclasses.replace(tool, cgo=False)
    assert nodebuild.tool_hash(static) != nodebuild.tool_hash(tool)
    assert "cgo" not in repr(nodebuild.CNI_PLUGINS)


def test_a_local_programs_cache_key_follows_its_sources_not_its_tests(tmp_path):
    module = tmp_path / "prog"
    module.mkdir()
    (module / "go.mod").write_text("module example/prog\n")
    (module / "main.go").write_text("package main\n\nfunc main() {}\n")
    program = nodebuild.LocalProgram(name="prog", module_dir=module, describe="Building prog")
    first = nodebuild.local_dir(program, tmp_path / "cache")
    assert first.parent == tmp_path / "cache" / "bin" and first.name.startswith("prog-")
    (module / "main_test.go").write_text("package main\n")
    assert nodebuild.local_dir(program, tmp_path / "cache") == first
    (module / "main.go").write_text("package main\n\nfunc main() { println() }\n")
    assert nodebuild.local_dir(program, tmp_path / "cache") != first
    relinked = nodebuild.LocalProgram(
        name="prog", module_dir=module, describe="Building prog", ldflags="-s"
    )
    assert nodebuild.local_dir(relinked, tmp_path / "cache") != nodebuild.local_dir(
        program, tmp_path / "cache"
    )
