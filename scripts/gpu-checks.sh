#!/usr/bin/env bash
# Every check that needs a real GPU, in one go, with the output appended to
# docs/gpu-checks.md. Run it from a checkout on a machine with an NVIDIA GPU and
# driver (no Docker needed):
#
#   scripts/gpu-checks.sh                       # install wheels from the index
#   scripts/gpu-checks.sh --wheelhouse DIR      # offline: wheels downloaded beforehand
#   scripts/gpu-checks.sh --no-install          # use the frameworks $PYTHON already has
#   scripts/gpu-checks.sh --frameworks torch    # only one framework
#   scripts/gpu-checks.sh --expect 2            # GPU count (default: nvidia-smi -L)
#   scripts/gpu-checks.sh --capture FILE        # also record nvidia-smi's raw answers (JSON)
#
# It runs, for each framework, in its own virtual environment with the versions
# and constraints of images/matrix.yaml:
#   1. the image smoke test in GPU mode (must pass),
#   2. the smoke test in CPU mode (must FAIL here: a GPU is visible),
# then the spawner's nvidia-smi validation check (gpuspawner.validation.gpucheck)
# with each image's CUDA version.
# With --capture, scripts/nvidia_smi_capture.py then records nvidia-smi's exact answers to every
# command line gpuspawner runs or emulates, idle and under load, for
# scripts/import_gpu_capture.py to turn into fixtures.
# The script exits non-zero if any expectation is not met.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
REPO=$(pwd)
OUT="$REPO/docs/gpu-checks.md"
PYTHON=${PYTHON:-python3}
FRAMEWORKS="torch tensorflow"
WHEELHOUSE=""
EXPECT=""
INSTALL=1
CAPTURE=""
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

while [ $# -gt 0 ]; do
    case "$1" in
        --wheelhouse) WHEELHOUSE=$2; shift 2 ;;
        --frameworks) FRAMEWORKS=$2; shift 2 ;;
        --expect) EXPECT=$2; shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        --capture) CAPTURE=$2; shift 2 ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "gpu-checks.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu-checks.sh: nvidia-smi is not on PATH, so this machine has no usable NVIDIA driver." >&2
    exit 2
fi
if [ -z "$EXPECT" ]; then
    EXPECT=$(nvidia-smi -L | grep -c '^GPU ')
fi

# Versions come from the matrix, never from this script.
matrix_value() {  # matrix_value IMAGE FIELD
    "$PYTHON" - "$1" "$2" <<'EOF'
import sys
sys.path.insert(0, ".")
from gpuspawner.images.matrix import load_matrix
spec = load_matrix("images/matrix.yaml").images[sys.argv[1]]
print(getattr(spec, sys.argv[2]) or "")
EOF
}

FAILED=0
LOG="$WORK/log.txt"

expect_rc() {  # expect_rc WANT LABEL COMMAND...: run, record, compare exit codes
    local want=$1 label=$2
    shift 2
    echo
    echo "### $label"
    echo "\$ $*"
    "$@" 2>&1
    local rc=$?
    if [ "$rc" = "$want" ]; then
        echo "-> exit $rc (as expected)"
    else
        echo "-> exit $rc (UNEXPECTED: wanted $want)"
        FAILED=1
    fi
}

{
    echo "## Run of $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo
    echo '```'
    echo "\$ nvidia-smi -L"
    nvidia-smi -L 2>&1
    echo "\$ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    echo "expecting $EXPECT GPU(s); python: $("$PYTHON" --version 2>&1)"
    want_py=$(matrix_value cuda-pytorch python)
    have_py=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$want_py" != "$have_py" ]; then
        echo "WARNING: the images use Python $want_py, this is $have_py: the constraints may not install (set PYTHON=python$want_py)"
    fi

    for fw in $FRAMEWORKS; do
        case "$fw" in
            torch) image="cuda-pytorch"; package="torch" ;;
            tensorflow) image="cuda-tensorflow"; package="tensorflow[and-cuda]" ;;
            *) echo "unknown framework $fw"; FAILED=1; continue ;;
        esac
        version=$(matrix_value "$image" framework_version)
        constraints=$(matrix_value "$image" constraints)
        if [ "$INSTALL" = 1 ]; then
            venv="$WORK/venv-$fw"
            py="$venv/bin/python"
            echo
            echo "### install $package==$version (constraints: $constraints)"
            "$PYTHON" -m venv "$venv"
            if [ -n "$WHEELHOUSE" ]; then
                source_args=(--no-index --find-links "$WHEELHOUSE")
            else
                source_args=()
            fi
            if ! "$venv/bin/pip" install --quiet "${source_args[@]}" \
                    --constraint "$constraints" "$package==$version" numpy 2>&1 | tail -5; then
                echo "-> install failed: skipping $fw"
                FAILED=1
                continue
            fi
        else
            py="$PYTHON"
            echo
            echo "### $fw as installed: $("$py" -c "import $fw; print($fw.__version__)" 2>&1 | tail -1) (matrix: $version)"
        fi
        expect_rc 0 "$fw: smoke test, GPU mode" \
            env NVIDIA_VISIBLE_DEVICES=all "$py" gpuspawner/images/smoke.py \
            --framework "$fw" --expect "$EXPECT"
        expect_rc 1 "$fw: smoke test, CPU mode (must fail: GPUs are visible)" \
            "$py" gpuspawner/images/smoke.py --framework "$fw" --cpu
    done

    # The spawner's init-container check, once per image CUDA version: the driver
    # must be new enough for every image the catalog offers on this GPU.
    for image in cuda-pytorch cuda-tensorflow; do
        cuda=$(matrix_value "$image" cuda)
        expect_rc 0 "spawner's nvidia-smi validation for $image (CUDA $cuda)" \
            env PYTHONPATH="$REPO" "$PYTHON" -m gpuspawner.validation.gpucheck \
            --expect "$EXPECT" --cuda "$cuda" --termination-log "$WORK/termination-log"
    done
    # The check must also fail on real hardware when the pod got fewer GPUs than it asked for.
    expect_rc 5 "spawner's nvidia-smi validation asked for $((EXPECT + 1)) GPUs (must fail: exit 5)" \
        env PYTHONPATH="$REPO" "$PYTHON" -m gpuspawner.validation.gpucheck \
        --expect $((EXPECT + 1)) --termination-log "$WORK/termination-log"
    echo "termination message: $(cat "$WORK/termination-log" 2>/dev/null)"
    if [ -n "$CAPTURE" ]; then
        expect_rc 0 "raw nvidia-smi answers, idle and under load, into $(basename "$CAPTURE")" \
            "$PYTHON" scripts/nvidia_smi_capture.py "$CAPTURE"
    fi
    echo
    echo "overall: $([ "$FAILED" = 0 ] && echo PASS || echo FAIL)"
    echo '```'
} > "$LOG"

cat "$LOG"
{
    echo
    cat "$LOG"
} >> "$OUT"
echo "appended to $OUT"
[ "$FAILED" = 0 ]
