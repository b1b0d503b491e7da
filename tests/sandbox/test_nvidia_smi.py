"""The emulated nvidia-smi against recorded real output (tests/fixtures/nvidia-smi/)."""

import io
import json
import re
from pathlib import Path

import pytest

from gpuspawner_sandbox import nvidia_smi
from gpuspawner_sandbox.devices import Fault, container_device_state, node_devices
from gpuspawner_sandbox.topology import parse_topology

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvidia-smi"


def recorded(name):
    """The verbatim output of a recorded sample (everything after its delimiter line)."""
    text = (FIXTURES / name).read_text()
    return text.split("# ----- verbatim output below this line -----\n", 1)[1]


def make_state(model="H100-80GB-HBM3", count=1, driver="590.48.01", bus_ids=None, mig=None):
    raw = {"name": "n1", "driver": driver, "gpu": {"model": model, "count": count}}
    if mig:
        raw["mig"] = mig
    node = parse_topology({"nodes": [raw]}).nodes[0]
    state = container_device_state(node, node_devices(node), faults_file="/nonexistent")
    for gpu, bus in zip(state["gpus"], bus_ids or [], strict=False):
        gpu["bus_id"] = bus
    return state


def smi(argv, state, faults=()):
    out, err = io.StringIO(), io.StringIO()
    rc = nvidia_smi.run(argv, state, list(faults), out, err)
    return rc, out.getvalue(), err.getvalue()


def layout(text):
    """Each line's length and where its cell borders are: the table's shape without values."""
    return [(len(line), [m.start() for m in re.finditer(r"[|+]", line)]) for line in text]


def test_table_matches_recorded_h100_exactly_apart_from_the_timestamp():
    want = recorded("table__h100-80gb-hbm3_590.48.01__idle.txt").splitlines()
    rc, got, _ = smi([], make_state(bus_ids=["00000000:00:09.0"]))
    got = got.splitlines()
    assert rc == 0
    assert len(got[0]) == len(want[0]) == 31
    assert re.match(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", got[0])
    assert got[1:] == want[1:]


def test_table_layout_matches_recorded_4x_a100_r555():
    want = recorded("table__A100SXMx4_555.42.02.txt").splitlines()
    rc, got, _ = smi([], make_state("A100-SXM4-80GB", 4, "555.42.02"))
    got = got.splitlines()[1:]  # the sample has no timestamp line
    assert rc == 0
    assert layout(got) == layout(want)
    # Everything except measured values (temperature, power, memory used) and bus ids.
    for ours, theirs in zip(got, want, strict=True):
        if "MiB" not in theirs and "00000000:" not in theirs:
            assert ours == theirs


def test_table_with_mig_devices_matches_recorded_layout():
    want = recorded("table__h100-80gb-hbm3-MIG_590.48.01__idle.txt").splitlines()
    state = make_state(
        bus_ids=["00000000:00:09.0"],
        mig={"strategy": "mixed", "profiles": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
    )
    rc, got, _ = smi([], state)
    got = got.splitlines()
    assert rc == 0
    assert layout(got[1:]) == layout(want[1:])
    assert [line[:19] for line in got if line.startswith("|  0  ")] == [
        line[:19] for line in want if line.startswith("|  0  ")
    ]
    # The GPU row of a MIG-enabled GPU reports "On" in the ECC cell and N/A utilisation.
    assert "|                   On |" in got[8]
    assert "N/A      Default" in got[9]


def test_legacy_driver_gets_the_narrow_table_layout():
    want = recorded("table__t4_510.47.03__openshift.txt").splitlines()
    rc, got, _ = smi([], make_state("T4", 1, "510.47.03", bus_ids=["00000000:00:1E.0"]))
    got = got.splitlines()
    assert rc == 0
    # The sample's timestamp line has no trailing spaces; the rest must have the same shape.
    assert layout(got[1:]) == layout(want[1:])
    assert got[2] == want[2]
    assert got[8].startswith("|   0  Tesla T4            On   | 00000000:00:1E.0 Off |")


def test_list_gpus_with_mig_matches_recorded_form():
    want = recorded("list-L__h100-80gb-hbm3-MIG_590.48.01.txt").splitlines()
    state = make_state(
        mig={"strategy": "mixed", "profiles": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}
    )
    rc, got, _ = smi(["-L"], state)
    got = got.splitlines()
    assert rc == 0
    uuid = re.compile(r"(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    assert [uuid.sub("UUID", line) for line in got] == [uuid.sub("UUID", line) for line in want]
    assert state["gpus"][0]["uuid"] in got[0]


def test_list_gpus_reports_exactly_the_container_gpus():
    state = make_state("A100-SXM4-80GB", 4)
    state["gpus"] = state["gpus"][1:3]
    rc, got, _ = smi(["-L"], state)
    assert rc == 0
    assert got.splitlines() == [
        f"GPU {i}: NVIDIA A100-SXM4-80GB (UUID: {g['uuid']})" for i, g in enumerate(state["gpus"])
    ]


def test_version_matches_recorded():
    rc, got, _ = smi(["--version"], make_state())
    assert rc == 0
    assert got == recorded("version__h100-80gb-hbm3_590.48.01.txt")


def test_query_gpu_matches_recorded_projection():
    want = recorded("query-gpu-csv-PROJECTED__h100-80gb-hbm3_590.48.01__idle.txt").splitlines()
    fields = ",".join(h.split(" [")[0] for h in want[0].split(", "))
    state = make_state(bus_ids=["00000000:00:09.0"])
    rc, got, _ = smi([f"--query-gpu={fields}", "--format=csv"], state)
    got = got.splitlines()
    assert rc == 0
    assert got[0] == want[0]
    ours, theirs = got[1].split(", "), want[1].split(", ")
    theirs[1] = state["gpus"][0]["uuid"]  # the sample's UUID is masked
    assert ours == theirs


def test_every_recorded_field_is_accepted_with_its_recorded_header():
    want = recorded("query-gpu-csv-ALLFIELDS__h100-80gb-hbm3_590.48.01__idle.txt").splitlines()
    fields = ",".join(h.split(" [")[0] for h in want[0].split(", "))
    rc, got, _ = smi([f"--query-gpu={fields}", "--format=csv"], make_state())
    assert rc == 0
    assert got.splitlines()[0] == want[0]
    assert len(got.splitlines()[1].split(", ")) == len(want[1].split(", "))


def test_nounits_strips_values_but_keeps_header_units():
    sample = recorded("query-gpu-csv-nounits-header__tesla-p100__netdata.txt").splitlines()
    assert "memory.used [MiB]" in sample[0]  # what the real tool does with nounits
    rc, got, _ = smi(
        ["--query-gpu=memory.total,memory.used,power.draw,name", "--format=csv,nounits"],
        make_state("A100-SXM4-80GB"),
    )
    assert rc == 0
    assert got.splitlines() == [
        "memory.total [MiB], memory.used [MiB], power.draw [W], name",
        "81920, 0, 59.00, NVIDIA A100-SXM4-80GB",
    ]


def test_noheader_nounits_gives_one_row_per_gpu():
    state = make_state("A100-SXM4-80GB", 2)
    rc, got, _ = smi(
        ["--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"], state
    )
    assert rc == 0
    assert got.splitlines() == [f"{i}, {g['uuid']}, 81920" for i, g in enumerate(state["gpus"])]


def test_aliases_answer_with_the_canonical_header():
    rc, got, _ = smi(["--query-gpu=gpu_name,gpu_uuid", "--format=csv"], make_state())
    assert rc == 0
    assert got.splitlines()[0] == "name, uuid"


def test_unknown_field_fails_like_the_real_tool():
    rc, got, err = smi(
        ["--query-gpu=device_minor,gpu_uuid,pci.bus_id", "--format=csv,noheader,nounits"],
        make_state(),
    )
    assert rc == 2
    assert got == recorded("error-invalid-field__rc2__cohdi-37.txt")
    assert err == ""


def test_unknown_option_is_an_invalid_argument():
    rc, _, _ = smi(["--frobnicate"], make_state())
    assert rc == 2


def test_driver_not_loaded_fault():
    rc, got, err = smi([], make_state(), [Fault("n1", "driver-not-loaded")])
    assert rc == 9
    assert got == recorded("error-driver-not-loaded__rc9__nvidia_gpu_exporter-65.txt")
    assert err.strip() == got.strip()


def test_uncorrectable_ecc_fault_shows_in_query_and_table():
    state = make_state("A100-SXM4-80GB", 2)
    fault = Fault("n1", "ecc", gpu=state["gpus"][1]["uuid"], value="3")
    rc, got, _ = smi(
        [
            "--query-gpu=index,ecc.errors.uncorrected.volatile.total,remapped_rows.pending",
            "--format=csv,noheader",
        ],
        state,
        [fault],
    )
    assert rc == 0
    assert got.splitlines() == ["0, 0, No", "1, 3, Yes"]
    _, text, _ = smi([], state, [fault])
    ecc_cells = [line.split("|")[3].strip() for line in text.splitlines() if "00000000:" in line]
    assert ecc_cells == ["0", "3"]


def test_missing_gpu_is_not_listed_and_none_left_means_no_devices():
    state = make_state("A100-SXM4-80GB", 2)
    rc, got, _ = smi(["-L"], state, [Fault("n1", "missing", gpu="0")])
    assert rc == 0
    assert got.splitlines() == [f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {state['gpus'][1]['uuid']})"]
    rc, got, _ = smi(["-L"], state, [Fault("n1", "missing")])
    assert rc == 6
    assert got == "No devices were found\n"


def test_gpu_lost_fault():
    sample = recorded("error-gpu-lost__windows-369.30__darknet-86.txt").replace("\n", "")
    state = make_state("A100-SXM4-80GB", 1)
    rc, got, _ = smi(["--query-gpu=uuid", "--format=csv"], state, [Fault("n1", "lost", gpu="0")])
    assert rc == 15
    # Newer drivers print the bus id right after "GPU" (see the "no-space" sample).
    bus = state["gpus"][0]["bus_id"][4:]
    assert got.strip() == sample.replace("GPU 0000:03:00.0", f"GPU{bus}").strip()


def test_driver_too_old_fault_changes_version_banner_and_layout():
    state = make_state("A100-SXM4-80GB", 1, driver="580.95.05")
    faults = [Fault("n1", "driver-too-old", value="470.82.01")]
    rc, got, _ = smi(["--query-gpu=driver_version", "--format=csv,noheader"], state, faults)
    assert (rc, got) == (0, "470.82.01\n")
    _, text, _ = smi([], state, faults)
    want = recorded("error-inforom-corrupted__p100_470.82.01__rc14.txt").splitlines()
    assert text.splitlines()[2] == want[0]  # banner of the real 470.82.01 table


def test_faults_for_other_nodes_do_not_apply():
    rc, _, _ = smi([], make_state(), [Fault("other", "driver-not-loaded")])
    assert rc == 0


def test_capture_file_is_the_recorded_fixture():
    capture = json.loads(nvidia_smi.CAPTURE_FILE.read_text())
    for key, name in (
        ("gpu", "query-gpu-csv-ALLFIELDS__h100-80gb-hbm3_590.48.01__idle.txt"),
        ("mig", "query-gpu-csv-ALLFIELDS__h100-80gb-hbm3-MIG_590.48.01__idle.txt"),
    ):
        lines = recorded(name).splitlines()
        assert [capture[key]["header"], capture[key]["row"]] == lines[:2]


def test_main_without_state_behaves_like_no_driver(monkeypatch, capsys):
    monkeypatch.delenv(nvidia_smi.STATE_ENV, raising=False)
    assert nvidia_smi.main([]) == 9
    assert "couldn't communicate with the NVIDIA driver" in capsys.readouterr().out


def test_id_option_selects_gpus_by_index_or_uuid():
    state = make_state("A100-SXM4-80GB", 3)
    uuid2 = state["gpus"][2]["uuid"]
    rc, got, _ = smi(["--query-gpu=uuid", "--format=csv,noheader", f"--id=0,{uuid2}"], state)
    assert rc == 0
    assert got.splitlines() == [state["gpus"][0]["uuid"], uuid2]


@pytest.mark.parametrize(
    ("sample", "model", "count", "driver"),
    [
        ("table__H100SXMx8_565.57.01.txt", "H100-80GB-HBM3", 8, "565.57.01"),
        ("table__8x-h100-80gb-hbm3_550.90.07.txt", "H100-80GB-HBM3", 8, "550.90.07"),
        ("table__t4__570.133.20__dstack-2860.txt", "T4", 1, "570.133.20"),
        ("table__l4__570.133.20__speaches-438.txt", "L4", 1, "570.133.20"),
        (
            "table__gb10-memory-NotSupported__580.95.05__inference-snaps-143.txt",
            "L4",
            1,
            "580.95.05",
        ),
    ],
)
def test_table_layout_per_driver_branch_matches_recorded_samples(sample, model, count, driver):
    want = recorded(sample).splitlines()
    if not want[0].startswith("+"):
        want = want[1:]  # the timestamp line, when the sample has one
    _, got, _ = smi([], make_state(model, count, driver))
    got = got.splitlines()[1:]
    # Samples pasted into issues may be cut short, and the spacer line between the two
    # tables is sometimes trimmed: compare the lines the sample has, spacer excepted.
    pairs = [(g, w) for g, w in zip(got, want, strict=False) if g.strip() or w.strip()]
    assert len(pairs) >= 10
    assert layout([g for g, _ in pairs]) == layout([w for _, w in pairs])
