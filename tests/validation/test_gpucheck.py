"""The GPU check's parsers and decision, against recorded nvidia-smi output."""

from __future__ import annotations

import pytest

from gpuspawner.validation import gpucheck
from gpuspawner.validation.gpucheck import (
    EXIT_DRIVER_TOO_OLD,
    EXIT_GPU_COUNT,
    EXIT_GPU_UNHEALTHY,
    EXIT_UNREADABLE_OUTPUT,
    CheckFailed,
    CommandResult,
    OutputError,
    evaluate,
    merge_rows,
    parse_list,
    parse_query_csv,
)
from tests.validation.nvsmi_fixtures import (
    CAPTURES,
    CHANGES,
    CORE_FIELDS,
    FIXTURES,
    HEALTH_FIELDS,
    MERGED_LIST,
    MERGED_LIST_SOURCES,
    apply_change,
    body,
    changed_name,
    derive,
    derived_name,
    merged_list,
    project,
    read_fixture,
)

NO_DEVICES = "error-no-devices__gh200_570.86.15__open-gpu-kernel-modules-774.txt"
LOADER_WARNING = "stderr-loader-warning__libnvidia-ml-no-version-information.txt"


def records_for(capture: str, core: str | None = None, health: str | None = None):
    """GpuRecords from a capture's derived core and health query output."""
    core_rows = parse_query_csv(body(core or derived_name(capture, "core")), CORE_FIELDS)
    health_rows = parse_query_csv(body(health or derived_name(capture, "health")), HEALTH_FIELDS)
    return merge_rows(core_rows, health_rows)


LISTS = {
    "h100-80gb-hbm3_590.48.01": "list-L__h100-80gb-hbm3_590.48.01.txt",
    "h100-80gb-hbm3-MIG_590.48.01": "list-L__h100-80gb-hbm3-MIG_590.48.01.txt",
    "h200_590.48.01": "list-L__h200_590.48.01.txt",
    "l40s_595.80": "list-L__l40s_595.80.txt",
    "rtx2080super_linux_610.57.04": "list-L__rtx2080super_linux_610.57.04.txt",
    "rtx4080super_linux_595.71.05": "list-L__rtx4080super_linux_595.71.05.txt",
}


def test_the_check_asks_for_the_fields_the_fixtures_were_derived_for():
    assert gpucheck.CORE_FIELDS == CORE_FIELDS
    assert ("index", *gpucheck.HEALTH_FIELDS) == HEALTH_FIELDS


@pytest.mark.parametrize("capture", sorted(CAPTURES))
def test_requested_fields_exist_in_real_allfields_captures(capture):
    _, csv_text = read_fixture(FIXTURES / CAPTURES[capture])
    header = csv_text.splitlines()[0].split(", ")
    names = {cell.split(" [")[0] for cell in header}
    assert set(CORE_FIELDS) | set(HEALTH_FIELDS) <= names


@pytest.mark.parametrize("capture", sorted(CAPTURES))
@pytest.mark.parametrize("query", ["core", "health"])
def test_derived_fixtures_match_their_real_source(capture, query):
    name = derived_name(capture, query)
    assert (FIXTURES / name).read_text(encoding="utf-8") == derive(capture, query)


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.name)
def test_changed_fixtures_differ_from_their_source_in_one_cell_only(change):
    changed = (FIXTURES / changed_name(change)).read_text(encoding="utf-8")
    assert changed == apply_change(change)
    original = body(derived_name(change.capture, change.query)).split(", ")
    modified = body(changed_name(change)).split(", ")
    assert sum(a != b for a, b in zip(original, modified, strict=True)) == 1


def test_the_merged_list_fixture_is_its_two_sources_one_after_the_other():
    assert (FIXTURES / MERGED_LIST).read_text(encoding="utf-8") == merged_list()
    listing, warning = MERGED_LIST_SOURCES
    assert body(MERGED_LIST) == body(listing) + body(warning)


# --- nvidia-smi -L ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "names"),
    [
        ("list-L__h200_590.48.01.txt", ["NVIDIA H200"]),
        ("list-L__2x-a100-pcie-40gb__insights-core.txt", ["NVIDIA A100-PCIE-40GB"] * 2),
        (
            "list-L__2xA10-2xT4__570.133.20__nct-1227.txt",
            ["NVIDIA A10", "NVIDIA A10", "Tesla T4", "Tesla T4"],
        ),
        ("list-L__8x-quadro-rtx-8000__insights-core.txt", ["Quadro RTX 8000"] * 8),
        (
            "list-L__t1000-plus-v100-pcie-16gb__insights-core.txt",
            ["NVIDIA T1000", "Tesla V100-PCIE-16GB"],
        ),
    ],
)
def test_parse_list_reads_gpus(fixture, names):
    gpus = parse_list(body(fixture))
    assert [gpu.name for gpu in gpus] == names
    assert [gpu.index for gpu in gpus] == list(range(len(names)))
    assert all(gpu.uuid.startswith("GPU-") and not gpu.mig_devices for gpu in gpus)
    assert len({gpu.uuid for gpu in gpus}) == len(gpus)


def test_parse_list_reads_mig_devices_under_their_gpu():
    (gpu,) = parse_list(body("list-L__h100-80gb-hbm3-MIG_590.48.01.txt"))
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert [d.profile for d in gpu.mig_devices] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert [d.index for d in gpu.mig_devices] == [0, 1, 2, 3]
    assert gpu.mig_devices[1].uuid == "MIG-00000001-0000-0000-0000-000000000001"


def test_parse_list_reads_the_legacy_r450_mig_uuid_form():
    (gpu,) = parse_list(body("list-L__a100-sxm4-40gb-MIG-legacyUUID_450.80.02.txt"))
    assert gpu.name == "A100-SXM4-40GB"
    assert len(gpu.mig_devices) == 7
    assert {d.profile for d in gpu.mig_devices} == {"1g.5gb"}
    assert gpu.mig_devices[0].uuid == "MIG-GPU-4200ccc0-2667-d4cb-9137-f932c716232a/7/0"
    assert gpu.mig_devices[6].uuid.endswith("/13/0")


def test_parse_list_treats_no_devices_as_empty():
    assert parse_list("No devices were found\n") == []


@pytest.mark.parametrize(
    "fixture",
    [
        "error-driver-not-loaded__rc9__nvidia_gpu_exporter-65.txt",
        "error-libnvidia-ml-not-found__rc12__nvidia_gpu_exporter-105.txt",
    ],
)
def test_parse_list_refuses_what_it_does_not_know(fixture):
    with pytest.raises(OutputError):
        parse_list(body(fixture))


# --- --query-gpu CSV ----------------------------------------------------------------------


def test_parse_query_csv_reads_eight_gpus_with_any_field_list():
    fields = ("index", "uuid", "name", "temperature.gpu", "utilization.gpu", "memory.used",
              "memory.total")  # fmt: skip
    rows = parse_query_csv(body("query-gpu-csv-noheader-nounits__8x-titanx__gpustat-5.txt"), fields)
    assert len(rows) == 8
    assert [row["index"] for row in rows] == [str(i) for i in range(8)]
    assert rows[7]["uuid"] == "GPU-f199c9ea-65d8-5382-aefe-a9e8fb48057b"
    assert {row["name"] for row in rows} == {"GeForce GTX TITAN X"}
    assert gpucheck.GpuRecord.from_row(rows[0]).memory_total_mib == 12206


def test_parse_query_csv_refuses_a_row_of_the_wrong_width():
    with pytest.raises(OutputError, match="expected 6"):
        parse_query_csv(
            body("query-gpu-csv-noheader-nounits__8x-titanx__gpustat-5.txt"), CORE_FIELDS
        )


@pytest.mark.parametrize(
    "raw",
    [
        "[N/A]",
        "N/A",
        "[Not Supported]",
        "[Requested functionality has been deprecated]",
        "[Function Not Found]",
        " ",
        "",
    ],
)
def test_unavailable_values_are_not_reported(raw):
    assert gpucheck.clean_value(raw) is None
    assert gpucheck.parse_int(raw) is None
    assert gpucheck.parse_yes_no(raw) is None
    assert not gpucheck.is_error_value(raw)


@pytest.mark.parametrize(
    "raw",
    [
        "[Unknown Error]",
        " [Unknown Error]",
        "[GPU is lost]",
        "[Insufficient Permissions]",
        "Unknown",
    ],
)
def test_nvml_errors_are_kept_apart_from_not_reported(raw):
    assert gpucheck.clean_value(raw) == raw.strip()
    assert gpucheck.is_error_value(raw)
    assert gpucheck.parse_int(raw) is None
    assert gpucheck.parse_yes_no(raw) is None


@pytest.mark.parametrize("raw", ["0", "Enabled", "No", "NVIDIA H100 80GB HBM3", None])
def test_values_are_not_errors(raw):
    assert not gpucheck.is_error_value(raw)


def test_geforce_health_fields_are_all_not_reported():
    (record,) = records_for("rtx2080super_linux_610.57.04")
    assert record.ecc_mode is None
    assert record.ecc_uncorrected_volatile is None
    assert record.retired_pages_pending is None
    assert record.remapped_rows_pending is None
    assert record.mig_mode is None
    assert record.memory_total_mib == 8192


def test_records_merge_core_and_health_rows():
    (record,) = records_for("h100-80gb-hbm3_590.48.01")
    assert record.index == 0
    assert record.name == "NVIDIA H100 80GB HBM3"
    assert record.driver_version == "590.48.01"
    assert record.pci_bus_id == "00000000:00:09.0"
    assert record.memory_total_mib == 81559
    assert record.ecc_mode == "Enabled"
    assert record.ecc_uncorrected_volatile == 0
    assert record.retired_pages_pending is None  # [N/A] on Hopper
    assert record.remapped_rows_pending is False
    assert record.remapped_rows_failure is False
    assert record.mig_mode == "Disabled"


def test_inforom_warning_is_split_off_the_output():
    data, warnings = gpucheck.split_warnings(
        body("error-inforom-corrupted__p100_470.82.01__rc14.txt")
    )
    assert warnings == ["WARNING: infoROM is corrupted at gpu 0000:0B:00.0"]
    assert not any(line.startswith("WARNING") for line in data)


# --- evaluate -----------------------------------------------------------------------------


@pytest.mark.parametrize("capture", sorted(LISTS))
def test_healthy_single_gpu_captures_pass(capture):
    listing = parse_list(body(LISTS[capture]))
    records = records_for(capture)
    expected = sum(len(g.mig_devices) or 1 for g in listing)
    result = evaluate(expected, "nvidia.com/gpu", listing, records, cuda="12.4")
    assert result.ok, result.reason
    assert result.exit_code == 0
    text = "\n".join(result.report)
    assert records[0].name in text
    assert records[0].uuid in text
    assert records[0].driver_version in text
    assert f"{records[0].memory_total_mib} MiB" in text
    assert "needs 525.60.13 or newer" in text


def test_two_gpus_listed_without_details_pass():
    listing = parse_list(body("list-L__2x-a100-pcie-40gb__insights-core.txt"))
    result = evaluate(2, "nvidia.com/gpu", listing, [])
    assert result.ok
    assert "OK: 2 GPUs visible" in "\n".join(result.report)


def test_eight_gpus_from_csv_pass():
    fields = ("index", "uuid", "name", "temperature.gpu", "utilization.gpu", "memory.used",
              "memory.total")  # fmt: skip
    rows = parse_query_csv(body("query-gpu-csv-noheader-nounits__8x-titanx__gpustat-5.txt"), fields)
    records = merge_rows(rows)
    assert evaluate(8, "nvidia.com/gpu", None, records).ok
    too_many = evaluate(4, "nvidia.com/gpu", None, records)
    assert not too_many.ok
    assert too_many.exit_code == EXIT_GPU_COUNT
    assert too_many.reason.startswith("8 GPUs are visible but only 4 were requested")


def test_eight_listed_gpus_pass():
    listing = parse_list(body("list-L__8x-quadro-rtx-8000__insights-core.txt"))
    assert evaluate(8, "nvidia.com/gpu", listing, []).ok


def test_fewer_gpus_than_requested_fails_with_the_issue_wording():
    listing = parse_list(body(LISTS["h100-80gb-hbm3_590.48.01"]))
    result = evaluate(2, "nvidia.com/gpu", listing, records_for("h100-80gb-hbm3_590.48.01"))
    assert not result.ok
    assert result.exit_code == EXIT_GPU_COUNT
    assert result.reason == (
        "Only 1 of the 2 requested GPUs is visible: the node's device plugin gave this "
        "container fewer GPUs than it asked for; ask an admin to check the node."
    )
    assert "\n" not in result.reason


def test_no_gpu_visible_fails():
    result = evaluate(1, "nvidia.com/gpu", [], [])
    assert result.exit_code == EXIT_GPU_COUNT
    assert result.reason.startswith("No GPU is visible in this container, although 1 was requested")


@pytest.mark.parametrize(
    ("change_name", "phrase"),
    [
        ("ecc-uncorrected-volatile-2", "has 2 uncorrectable ECC errors since the driver loaded"),
        ("retired-pages-pending-yes", "has a memory page retirement pending"),
        ("remapped-rows-pending-yes", "has a memory row remapping pending"),
        ("remapped-rows-failure-yes", "failed to remap a faulty memory row"),
        (
            "ecc-uncorrected-volatile-unknown-error",
            "could not report ecc.errors.uncorrected.volatile.total: nvidia-smi printed "
            "[Unknown Error]",
        ),
    ],
)
def test_health_problems_fail(change_name, phrase):
    (change,) = [c for c in CHANGES if c.name == change_name]
    records = records_for(change.capture, health=changed_name(change))
    listing = parse_list(body(LISTS[change.capture]))
    result = evaluate(1, "nvidia.com/gpu", listing, records, cuda="12.4")
    assert not result.ok
    assert result.exit_code == EXIT_GPU_UNHEALTHY
    assert result.reason.startswith("GPU 0 (NVIDIA H100 80GB HBM3, GPU-00000000-")
    assert phrase in result.reason
    assert "ask an admin" in result.reason


def test_an_unknown_error_in_a_health_field_is_never_reported_as_ok():
    (change,) = [c for c in CHANGES if c.name == "ecc-uncorrected-volatile-unknown-error"]
    records = records_for(change.capture, health=changed_name(change))
    (record,) = records
    assert record.unreadable == {"ecc.errors.uncorrected.volatile.total": "[Unknown Error]"}
    assert record.ecc_uncorrected_volatile is None
    assert record.ecc_mode == "Enabled"  # the other fields of the row still read
    listing = parse_list(body(LISTS[change.capture]))
    result = evaluate(1, "nvidia.com/gpu", listing, records, cuda="12.4")
    assert result.exit_code == EXIT_GPU_UNHEALTHY
    text = "\n".join(result.report)
    assert "OK: no uncorrectable ECC errors" not in text
    assert "ecc.errors.uncorrected.volatile.total [Unknown Error]" in text
    assert "this GPU's health is unknown" in result.reason


def test_an_unknown_error_in_a_detail_field_is_only_a_warning():
    # The H100 core row with memory.total replaced by the error text, as in the health fixture.
    core_text = body(derived_name("h100-80gb-hbm3_590.48.01", "core")).replace(
        ", 81559", ", [Unknown Error]"
    )
    core = parse_query_csv(core_text, CORE_FIELDS)
    health = parse_query_csv(
        body(derived_name("h100-80gb-hbm3_590.48.01", "health")), HEALTH_FIELDS
    )
    records = merge_rows(core, health)
    listing = parse_list(body(LISTS["h100-80gb-hbm3_590.48.01"]))
    result = evaluate(1, "nvidia.com/gpu", listing, records)
    assert result.ok
    assert result.warnings == [
        "GPU 0 (NVIDIA H100 80GB HBM3, GPU-00000000-0000-0000-0000-000000000000): nvidia-smi "
        "printed [Unknown Error] for memory.total."
    ]


def test_old_driver_fails_for_a_newer_cuda_major():
    (change,) = [c for c in CHANGES if c.name == "driver-535.161.08"]
    records = records_for(change.capture, core=changed_name(change))
    listing = parse_list(body(LISTS[change.capture]))
    assert evaluate(1, "nvidia.com/gpu", listing, records, cuda="12.4").ok
    result = evaluate(1, "nvidia.com/gpu", listing, records, cuda="13.0")
    assert result.exit_code == EXIT_DRIVER_TOO_OLD
    assert result.reason.startswith(
        "The node's NVIDIA driver 535.161.08 is too old for this image's CUDA 13.0, which needs "
        "driver 580.65.06 or newer"
    )


def test_several_problems_name_the_first_and_count_the_rest():
    (change,) = [c for c in CHANGES if c.name == "ecc-uncorrected-volatile-2"]
    records = records_for(change.capture, health=changed_name(change))
    listing = parse_list(body(LISTS[change.capture]))
    result = evaluate(2, "nvidia.com/gpu", listing, records)
    assert result.exit_code == EXIT_GPU_COUNT
    assert result.reason.endswith("(1 more problem in the gpu-check log)")
    assert sum(line.startswith("FAILED: ") for line in result.report) == 2


@pytest.mark.parametrize(
    ("cuda", "driver", "ok"),
    [
        ("13.0", "580.65.06", True),
        ("13.2", "580.65.05", False),
        ("13.1", "575.57.08", False),
        ("12.8", "525.60.13", True),
        ("12.0", "525.60.11", False),
        ("12.4", "470.82.01", False),
        ("11.8", "450.80.02", True),
        ("11.1", "450.51.06", False),
        ("11.0", "450.36.06", True),
        ("10.2", "440.33", True),
        ("10.1", "410.104", False),
        ("12", "535.104.12", True),
        ("12.4.1", "550.54.14", True),
    ],
)
def test_driver_floor(cuda, driver, ok):
    (record,) = records_for("h100-80gb-hbm3_590.48.01")
    record.driver_version = driver
    result = evaluate(1, "nvidia.com/gpu", None, [record], cuda=cuda)
    assert result.ok is ok, result.reason


def test_an_empty_cuda_version_skips_the_driver_check():
    # validation_command's {cuda} placeholder is empty when the image's CUDA is unknown.
    (change,) = [c for c in CHANGES if c.name == "driver-535.161.08"]
    records = records_for(change.capture, core=changed_name(change))
    result = evaluate(1, "nvidia.com/gpu", None, records, cuda="")
    assert result.ok
    assert not result.warnings


def test_time_sliced_replicas_may_share_a_gpu():
    listing = parse_list(body(LISTS["l40s_595.80"]))
    records = records_for("l40s_595.80")
    assert evaluate(2, "nvidia.com/gpu.shared", listing, records).ok
    assert evaluate(2, "nvidia.com/gpu", listing, records).exit_code == EXIT_GPU_COUNT
    assert evaluate(1, "nvidia.com/gpu.shared", [], []).exit_code == EXIT_GPU_COUNT


@pytest.mark.parametrize("cuda", ["9.2", "14.0", "latest"])
def test_unknown_cuda_versions_are_not_failures(cuda):
    records = records_for("l40s_595.80")
    result = evaluate(1, "nvidia.com/gpu", None, records, cuda=cuda)
    assert result.ok
    assert result.warnings


def test_not_reported_fields_pass_and_say_so():
    records = records_for("rtx2080super_linux_610.57.04")
    listing = parse_list(body(LISTS["rtx2080super_linux_610.57.04"]))
    result = evaluate(1, "nvidia.com/gpu", listing, records, cuda="13.0")
    assert result.ok
    assert "ECC not reported" in "\n".join(result.report)


# --- MIG ----------------------------------------------------------------------------------


def test_mig_resource_counts_only_devices_of_its_profile():
    # One H100 with a 3g.40gb, a 2g.20gb and two 1g.10gb devices.
    listing = parse_list(body(LISTS["h100-80gb-hbm3-MIG_590.48.01"]))
    records = records_for("h100-80gb-hbm3-MIG_590.48.01")
    short = evaluate(3, "nvidia.com/mig-1g.10gb", listing, records)
    assert short.exit_code == EXIT_GPU_COUNT
    assert short.reason.startswith(
        "Only 2 of the 3 requested MIG devices (1g.10gb) is visible (it sees a 3g.40gb MIG "
        "device, a 2g.20gb MIG device instead)"
    )
    extra = evaluate(2, "nvidia.com/mig-1g.10gb", listing, records)
    assert extra.exit_code == EXIT_GPU_COUNT
    assert extra.reason.startswith(
        "The 2 requested MIG devices (1g.10gb) are visible, but so are a 3g.40gb MIG device, a "
        "2g.20gb MIG device: this container can use devices it was not given"
    )
    assert "2 MIG devices (1g.10gb) visible, 2 requested" in "\n".join(extra.report)
    # The device plugin's "single" strategy hands out all four as nvidia.com/gpu.
    assert evaluate(4, "nvidia.com/gpu", listing, records).ok


def test_devices_of_another_profile_do_not_satisfy_a_mig_request():
    listing = parse_list(body("list-L__h100-MIG-single__cloud-native-docs.txt"))
    assert {d.profile for d in listing[0].mig_devices} == {"1g.10gb"}
    result = evaluate(7, "nvidia.com/mig-3g.40gb", listing, [])
    assert result.exit_code == EXIT_GPU_COUNT
    assert result.reason.startswith(
        "No MIG device (3g.40gb) is visible in this container (it sees a 1g.10gb MIG device, "
        "a 1g.10gb MIG device, a 1g.10gb MIG device, … instead), although 7 were requested"
    )


def test_mig_single_strategy_counts_seven_devices():
    listing = parse_list(body("list-L__h100-MIG-single__cloud-native-docs.txt"))
    result = evaluate(7, "nvidia.com/mig-1g.10gb", listing, [])
    assert result.ok
    assert not result.warnings
    assert "OK: 7 MIG devices (1g.10gb) visible" in "\n".join(result.report)
    short = evaluate(8, "nvidia.com/mig-1g.10gb", listing, [])
    assert short.reason.startswith("Only 7 of the 8 requested MIG devices (1g.10gb) is visible:")


def test_a_mixed_listing_fails_a_request_for_one_of_its_profiles():
    listing = parse_list(body("list-L__h100-MIG-mixed__cloud-native-docs.txt"))
    result = evaluate(1, "nvidia.com/mig-3g.40gb", listing, [])
    assert result.exit_code == EXIT_GPU_COUNT
    assert result.reason.startswith(
        "The 1 requested MIG device (3g.40gb) is visible, but so are a 2g.20gb MIG device, a "
        "1g.10gb MIG device, a 1g.10gb MIG device:"
    )


def test_media_extension_profiles_match_their_resource_name():
    # nvidia-smi -L prints "1g.10gb+me"; the device plugin advertises nvidia.com/mig-1g.10gb.me.
    assert gpucheck.resource_profile("1g.10gb+me") == "1g.10gb.me"
    gpu = gpucheck.ListedGpu(
        0,
        "NVIDIA H100 80GB HBM3",
        "GPU-00000000-0000-0000-0000-000000000000",
        [gpucheck.MigDevice("1g.10gb+me", 0, "MIG-00000000-0000-0000-0000-000000000000")],
    )
    assert evaluate(1, "nvidia.com/mig-1g.10gb.me", [gpu], []).ok
    assert evaluate(1, "nvidia.com/mig-1g.10gb", [gpu], []).exit_code == EXIT_GPU_COUNT


def test_legacy_mig_devices_count():
    listing = parse_list(body("list-L__a100-sxm4-40gb-MIG-legacyUUID_450.80.02.txt"))
    assert evaluate(7, "nvidia.com/mig-1g.5gb", listing, []).ok


def test_mig_mode_is_read_from_the_csv_when_the_list_is_unreadable():
    with pytest.raises(OutputError):
        parse_list(body(MERGED_LIST))
    records = records_for("h200-MIG_590.48.01")
    assert records[0].mig_enabled is True
    result = evaluate(1, "nvidia.com/gpu", None, records)
    assert result.exit_code == EXIT_UNREADABLE_OUTPUT
    assert result.reason.startswith(
        "GPU 0 (NVIDIA H200, GPU-00000000-0000-0000-0000-000000000000) has MIG mode enabled or "
        "not reported, but nvidia-smi -L printed output the GPU check does not understand"
    )
    # The same board with MIG disabled is counted from the CSV as one whole GPU.
    assert evaluate(1, "nvidia.com/gpu", None, records_for("h200_590.48.01")).ok
    no_mig = evaluate(1, "nvidia.com/mig-1g.18gb", None, records_for("h200_590.48.01"))
    assert no_mig.exit_code == EXIT_GPU_COUNT
    assert no_mig.reason.startswith("No MIG device (1g.18gb) is visible in this container")


def test_mig_devices_cannot_be_counted_without_the_list_when_mig_mode_is_unknown():
    fields = ("index", "uuid", "name", "temperature.gpu", "utilization.gpu", "memory.used",
              "memory.total")  # fmt: skip
    rows = parse_query_csv(body("query-gpu-csv-noheader-nounits__8x-titanx__gpustat-5.txt"), fields)
    records = merge_rows(rows)
    assert records[0].mig_enabled is None
    assert evaluate(8, "nvidia.com/gpu", None, records).ok
    result = evaluate(1, "nvidia.com/mig-1g.10gb", None, records)
    assert result.exit_code == EXIT_UNREADABLE_OUTPUT


def test_mig_enabled_gpu_without_mig_devices_cannot_run_cuda():
    # The H200's -L without MIG devices, paired with the same board's CSV in MIG mode (both
    # masked to the same UUID): what a container sees when handed a MIG-mode GPU as a whole.
    listing = parse_list(body(LISTS["h200_590.48.01"]))
    records = records_for("h200-MIG_590.48.01")
    assert records[0].mig_mode == "Enabled"
    result = evaluate(1, "nvidia.com/gpu", listing, records)
    assert result.exit_code == EXIT_GPU_COUNT
    assert result.reason.startswith("GPU 0 (NVIDIA H200) has MIG mode enabled but no MIG devices")


# --- nvidia-smi failures ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "returncode", "phrase"),
    [
        ("error-driver-not-loaded__rc9__nvidia_gpu_exporter-65.txt", 9, "driver is not loaded"),
        ("error-driver-not-loaded__plain__compute-gpu-installation-pr18.txt", 1,
         "driver is not loaded"),
        ("error-libnvidia-ml-not-found__rc12__nvidia_gpu_exporter-105.txt", 12,
         "libnvidia-ml.so) is missing"),
        ("error-nvml-version-mismatch__535.161__rc18__gputil-55.txt", 18, "version mismatch"),
        ("error-nvml-version-mismatch__legacy-one-line__shine-cluster-30.txt", 255,
         "version mismatch"),
        ("error-nvml-unknown-error__rc255__py3status-764.txt", 255, "internal or driver error"),
        ("error-gpu-lost__windows-369.30__darknet-86.txt", 255, "fallen off the bus"),
        ("error-invalid-field__rc2__cohdi-37.txt", 2, "rejected an argument"),
        ("error-device-handle-unknown-error__no-space__syno-22.txt", 255,
         "internal or driver error"),
    ],
)  # fmt: skip
def test_nvidia_smi_failures_get_readable_reasons(fixture, returncode, phrase):
    output = body(fixture)
    reason = gpucheck.nvidia_smi_failure(CommandResult(returncode, output))
    assert phrase in reason
    assert f"exit code {returncode}" in reason
    assert "ask an admin" in reason
    assert gpucheck.first_message(output) in reason
    assert "\n" not in reason


def test_every_man_page_return_code_has_a_reason():
    text = body("return-codes__nvidia-smi-manpage-RETURN-VALUE.txt")
    codes = {int(word) for word in text.replace("-", " ").split() if word.isdigit()}
    assert codes - {0} <= set(gpucheck.NVIDIA_SMI_EXIT_CODES)
    assert 18 in gpucheck.NVIDIA_SMI_EXIT_CODES


def test_exit_code_14_is_a_warning_and_the_output_is_used():
    warnings: list[str] = []
    output = body("error-inforom-corrupted__p100_470.82.01__rc14.txt")
    result = gpucheck.accept(CommandResult(14, output), warnings)
    assert result.stdout == output
    assert warnings == ["WARNING: infoROM is corrupted at gpu 0000:0B:00.0"]


def test_a_failure_printed_only_on_stderr_is_still_recognised_and_quoted():
    message = body("error-driver-not-loaded__rc9__nvidia_gpu_exporter-65.txt")
    # exit code 1 says nothing; the message on stderr says the driver is not loaded
    reason = gpucheck.nvidia_smi_failure(CommandResult(1, "", message))
    assert "exit code 1 (the NVIDIA driver is not loaded on the node)" in reason
    assert reason.endswith("nvidia-smi said: " + gpucheck.first_message(message))
    # stdout is quoted first; after a loader warning on stderr, stderr's last line is.
    both = CommandResult(255, "", body(LOADER_WARNING) + "Failed to initialize NVML: Unknown Error")
    assert gpucheck.nvidia_smi_failure(both).endswith(
        "nvidia-smi said: Failed to initialize NVML: Unknown Error"
    )


def test_a_loader_warning_on_stderr_is_reported_not_parsed():
    warnings: list[str] = []
    output = body(LISTS["l40s_595.80"])
    result = gpucheck.accept(CommandResult(0, output, body(LOADER_WARNING)), warnings)
    assert result.stdout == output
    assert warnings == [
        "nvidia-smi wrote on stderr: nvidia-smi: /lib/x86_64-linux-gnu/libnvidia-ml.so.1: no "
        "version information available (required by nvidia-smi)"
    ]


@pytest.mark.parametrize(
    ("fixture", "action"),
    [
        ("error-device-handle-unknown-error__no-space__syno-22.txt", "ask an admin to check"),
        ("error-device-handle-unknown-error__with-space__nvidia-docker-1553.txt", "check the node"),
        ("error-gpu-lost__windows-369.30__darknet-86.txt", "drain and reboot the node"),
    ],
)
@pytest.mark.parametrize("returncode", [0, 255])
def test_a_gpu_without_a_device_handle_stops_the_check(fixture, action, returncode):
    output = body(fixture)
    with pytest.raises(CheckFailed) as failure:
        gpucheck.accept(CommandResult(returncode, output), [])
    reason = failure.value.reason
    assert action in reason
    assert reason.endswith(gpucheck.first_message(output))


@pytest.mark.parametrize("returncode", [3, 4, 6, 8, 9, 10, 12, 13, 15, 18, 255, 42])
def test_other_exit_codes_stop_the_check(returncode):
    with pytest.raises(CheckFailed) as failure:
        gpucheck.accept(CommandResult(returncode, ""), [])
    assert failure.value.exit_code == gpucheck.EXIT_NVIDIA_SMI_FAILED
    assert f"exit code {returncode}" in failure.value.reason


# --- collect: the command sequence, with a runner that answers from the captures ----------


def capture_runner(
    capture: str,
    unknown_fields: tuple[str, ...] = (),
    stderr: str = "",
    listing: str | None = None,
):
    """Answer nvidia-smi arguments from a capture, like a driver that lacks ``unknown_fields``.

    Queries are projected from the ALLFIELDS capture with the fixtures' own projection; a
    query naming an unknown field gets the recorded rc-2 "not a valid field" output. Every run
    writes ``stderr`` (a fixture body) on stderr; ``listing`` replaces the capture's -L output.
    """
    calls: list[list[str]] = []
    csv_text = read_fixture(FIXTURES / CAPTURES[capture])[1]

    def run(args: list[str]) -> CommandResult:
        calls.append(args)
        if args == ["-L"]:
            return CommandResult(0, body(listing or LISTS[capture]), stderr)
        assert args[1] == "--format=csv,noheader,nounits"
        fields = tuple(args[0][len("--query-gpu=") :].split(","))
        if set(fields) & set(unknown_fields):
            return CommandResult(2, body("error-invalid-field__rc2__cohdi-37.txt"), stderr)
        return CommandResult(0, project(csv_text, fields), stderr)

    return run, calls


def test_collect_runs_list_then_two_queries():
    run, calls = capture_runner("l40s_595.80")
    collected = gpucheck.collect(run)
    assert [c[0] for c in calls] == [
        "-L",
        "--query-gpu=" + ",".join(CORE_FIELDS),
        "--query-gpu=" + ",".join(HEALTH_FIELDS),
    ]
    assert len(collected.listing) == 1
    assert collected.records[0].name == "NVIDIA L40S"
    assert collected.records[0].remapped_rows_pending is False
    assert not collected.warnings
    assert collected.no_devices is None


def test_collect_falls_back_to_single_fields_on_an_older_driver():
    run, calls = capture_runner(
        "h100-80gb-hbm3_590.48.01",
        unknown_fields=("remapped_rows.pending", "remapped_rows.failure"),
    )
    collected = gpucheck.collect(run)
    assert len(calls) == 3 + len(gpucheck.HEALTH_FIELDS)
    (record,) = collected.records
    assert record.ecc_uncorrected_volatile == 0
    assert record.mig_mode == "Disabled"
    assert record.remapped_rows_pending is None
    assert collected.warnings == [
        "This nvidia-smi does not know remapped_rows.pending, remapped_rows.failure; not checked."
    ]
    assert evaluate(
        1, "nvidia.com/gpu", collected.listing, collected.records, warnings=collected.warnings
    ).ok


def test_a_loader_warning_on_every_run_does_not_fail_a_healthy_gpu():
    run, _ = capture_runner("h100-80gb-hbm3_590.48.01", stderr=body(LOADER_WARNING))
    collected = gpucheck.collect(run)
    assert [gpu.name for gpu in collected.listing] == ["NVIDIA H100 80GB HBM3"]
    assert len(collected.warnings) == 1
    assert collected.warnings[0].startswith("nvidia-smi wrote on stderr: nvidia-smi: /lib/")
    result = evaluate(
        1, "nvidia.com/gpu", collected.listing, collected.records, warnings=collected.warnings
    )
    assert result.ok, result.reason
    assert "warning: " + collected.warnings[0] in result.report


def test_collect_keeps_mig_mode_when_the_list_is_unreadable():
    run, _ = capture_runner("h200-MIG_590.48.01", listing=MERGED_LIST)
    collected = gpucheck.collect(run)
    assert collected.listing is None
    assert collected.warnings[0].startswith("unexpected line in nvidia-smi -L output")
    assert collected.records[0].mig_enabled is True
    result = evaluate(1, "nvidia.com/gpu", None, collected.records)
    assert result.exit_code == EXIT_UNREADABLE_OUTPUT


@pytest.mark.parametrize("returncode", [0, 6])
def test_no_devices_is_quoted_in_the_reason(returncode):
    output = body(NO_DEVICES)
    calls: list[list[str]] = []

    def run(args: list[str]) -> CommandResult:
        calls.append(args)
        return CommandResult(returncode, output)

    collected = gpucheck.collect(run)
    assert calls == [["-L"]]
    assert collected.listing == [] and collected.records == []
    assert collected.no_devices == "No devices were found"
    result = evaluate(2, "nvidia.com/gpu", [], [], no_devices=collected.no_devices)
    assert result.exit_code == EXIT_GPU_COUNT
    assert result.reason.startswith(
        'nvidia-smi finds no GPU in this container ("No devices were found"), although 2 GPUs '
        "were requested"
    )


# --- finding nvidia-smi -------------------------------------------------------------------


def _executable(directory, name="nvidia-smi"):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n", encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def test_nvidia_smi_is_found_on_path_first(tmp_path):
    on_path = _executable(tmp_path / "bin")
    _executable(tmp_path / "usr-local-nvidia-bin")  # also there, but PATH wins
    found = gpucheck.find_nvidia_smi(
        "nvidia-smi",
        path=str(tmp_path / "bin"),
        known_dirs=(str(tmp_path / "usr-local-nvidia-bin"),),
    )
    assert found == (on_path, "on PATH")


def test_nvidia_smi_is_found_in_the_known_driver_locations_in_order(tmp_path):
    first, second = tmp_path / "usr-local-nvidia-bin", tmp_path / "run-nvidia-driver-usr-bin"
    in_second = _executable(second)
    dirs = (str(first), str(second))
    assert gpucheck.find_nvidia_smi(
        "nvidia-smi", path=str(tmp_path / "empty"), known_dirs=dirs
    ) == (
        in_second,
        f"not on PATH; found in {second}",
    )
    in_first = _executable(first)
    found = gpucheck.find_nvidia_smi("nvidia-smi", path="", known_dirs=dirs)
    assert found == (in_first, f"not on PATH; found in {first}")


def test_a_non_executable_file_in_a_known_location_is_not_used(tmp_path):
    directory = tmp_path / "usr-local-nvidia-bin"
    directory.mkdir()
    (directory / "nvidia-smi").write_text("", encoding="utf-8")
    assert gpucheck.find_nvidia_smi("nvidia-smi", path="", known_dirs=(str(directory),)) is None


def test_the_known_driver_locations():
    assert gpucheck.DRIVER_BIN_DIRS == ("/usr/local/nvidia/bin", "/run/nvidia/driver/usr/bin")


def test_a_path_is_used_as_given(tmp_path):
    binary = _executable(tmp_path / "opt")
    assert gpucheck.find_nvidia_smi(binary) == (binary, "as given")
    assert gpucheck.find_nvidia_smi(str(tmp_path / "missing" / "nvidia-smi")) is None


# --- real H200 captures (this project's own, scripts/gpu-checks.sh --capture) -------------

REAL_H200 = "h200_580.159.04"


def real(what: str) -> str:
    """The verbatim output of ``real__<what>__h200_580.159.04.txt``."""
    return body(f"real__{what}__{REAL_H200}.txt")


def real_runner():
    """Answer nvidia-smi arguments with the real H200's recorded answer to that exact command."""
    answers = {}
    for path in FIXTURES.glob(f"real__*__{REAL_H200}*.txt"):
        head, output = read_fixture(path)
        if "__load" in path.name or "__after" in path.name:
            continue
        command = next(line for line in head if line.startswith("# command: "))
        exit_code = next(line for line in head if line.startswith("# exit_code: "))
        answers[command[len("# command: ") :]] = CommandResult(
            int(exit_code[len("# exit_code: ") :]), output, ""
        )
    calls: list[list[str]] = []

    def run(args: list[str]) -> CommandResult:
        calls.append(args)
        return answers[" ".join(["nvidia-smi", *args])]

    return run, calls


def real_records():
    core = parse_query_csv(real("query-gpu-core"), CORE_FIELDS)
    health = parse_query_csv(real("query-gpu-health"), HEALTH_FIELDS)
    return merge_rows(core, health)


def test_the_real_captures_are_the_checks_own_queries():
    for what, fields in (("query-gpu-core", CORE_FIELDS), ("query-gpu-health", HEALTH_FIELDS)):
        head, _ = read_fixture(FIXTURES / f"real__{what}__{REAL_H200}.txt")
        assert f"# command: nvidia-smi {' '.join(gpucheck.query_args(fields))}" in head


def test_the_fixtures_derivation_reproduces_the_real_noheader_nounits_runs():
    # The derived__* fixtures project an ALLFIELDS csv capture; on the real H200 that
    # projection of its own ALLFIELDS answer equals what nvidia-smi printed for the exact query.
    allfields = body(f"real__query-gpu-allfields__{REAL_H200}__idle.txt")
    assert project(allfields, CORE_FIELDS) == real("query-gpu-core")
    assert project(allfields, HEALTH_FIELDS) == real("query-gpu-health")


def test_the_real_h200_parses():
    (gpu,) = parse_list(real("list-L"))
    assert gpu.name == "NVIDIA H200"
    assert gpu.uuid == "GPU-52b0c693-a3d5-f989-2ab8-cda89f0e8b18"
    assert not gpu.mig_devices
    (record,) = real_records()
    assert (record.index, record.name, record.driver_version) == (0, "NVIDIA H200", "580.159.04")
    assert (record.pci_bus_id, record.memory_total_mib) == ("00000000:00:06.0", 143771)
    assert (record.ecc_mode, record.ecc_uncorrected_volatile) == ("Enabled", 0)
    assert (record.remapped_rows_pending, record.remapped_rows_failure) == (False, False)
    assert record.mig_enabled is False
    assert record.unreadable == {}


def test_the_real_h200s_na_retired_pages_is_not_applicable_not_a_failure():
    # Hopper remaps rows instead of retiring pages: nvidia-smi prints [N/A] for the field.
    assert real("query-gpu-health").split(", ")[3] == "[N/A]"
    (record,) = real_records()
    assert record.retired_pages_pending is None
    assert "retired_pages.pending" not in record.unreadable
    result = evaluate(1, "nvidia.com/gpu", parse_list(real("list-L")), [record], cuda="13.0")
    assert result.ok, result.reason
    assert result.warnings == []
    assert "OK: no uncorrectable ECC errors, pending retirements or row remaps reported." in (
        result.report
    )


def test_the_real_h200_passes_when_one_gpu_is_expected():
    listing = parse_list(real("list-L"))
    result = evaluate(1, "nvidia.com/gpu", listing, real_records(), cuda="13.0")
    assert result.ok, result.reason
    assert result.exit_code == 0
    text = "\n".join(result.report)
    for part in ("NVIDIA H200", "GPU-52b0c693-a3d5-f989-2ab8-cda89f0e8b18", "580.159.04",
                 "143771 MiB", "ECC enabled, 0 uncorrectable errors"):  # fmt: skip
        assert part in text


def test_the_real_h200_fails_with_exit_5_when_two_gpus_are_expected():
    result = evaluate(2, "nvidia.com/gpu", parse_list(real("list-L")), real_records(), cuda="13.0")
    assert not result.ok
    assert result.exit_code == EXIT_GPU_COUNT == 5
    assert result.reason == (
        "Only 1 of the 2 requested GPUs is visible: the node's device plugin gave this "
        "container fewer GPUs than it asked for; ask an admin to check the node."
    )


def test_collect_on_the_real_h200_answers_runs_the_recorded_commands_and_passes():
    run, calls = real_runner()
    collected = gpucheck.collect(run)
    assert calls == [
        ["-L"],
        gpucheck.query_args(CORE_FIELDS),
        gpucheck.query_args(HEALTH_FIELDS),
    ]
    assert not collected.warnings
    assert evaluate(1, "nvidia.com/gpu", collected.listing, collected.records, cuda="13.0").ok
    assert evaluate(2, "nvidia.com/gpu", collected.listing, collected.records).exit_code == 5


def test_the_real_unknown_field_and_unknown_id_answers_are_read_as_failures():
    invalid = real("error-invalid-field__edpp_multiplier")
    assert invalid == 'Field "edpp_multiplier" is not a valid field to query.\n\n'
    assert gpucheck.nvidia_smi_failure(CommandResult(2, invalid, "")) == (
        "nvidia-smi failed with exit code 2 (nvidia-smi rejected an argument or flag), so the "
        "GPUs cannot be used; ask an admin to check the GPU check command. nvidia-smi said: "
        'Field "edpp_multiplier" is not a valid field to query.'
    )
    # The real exit code of "No devices were found" (INDEX.md lists it as unverified elsewhere).
    assert real("error-id-not-found") == "No devices were found\n"
    reason = gpucheck.nvidia_smi_failure(CommandResult(6, real("error-id-not-found"), ""))
    assert reason.startswith("nvidia-smi failed with exit code 6 (nvidia-smi could not find a GPU)")
    assert reason.endswith("nvidia-smi said: No devices were found")
