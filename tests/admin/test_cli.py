"""gpuspawner status: reading the admin service's JSON, and what the terminal shows."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuspawner import cli
from gpuspawner.admin.report import KueueData, build_report, report_from_dict
from gpuspawner.core.usage import Interval

from . import kueueobjects
from .kueueobjects import A100, GPU


@pytest.fixture
def service(users, pods, figures, catalog, now):
    """A stand-in for the service's api/status on 127.0.0.1: 403 unless the token is 'good'."""
    report = build_report(users=users, pods=pods, figures=figures, catalog=catalog, now=now)
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != "token good":
                self.send_response(403)
                self.end_headers()
                return
            body = json.dumps(report.as_dict()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_tables(service, capsys):
    url, seen = service
    assert cli.main(["status", "--hub-url", url, "--token", "good"]) == 0
    out = capsys.readouterr().out
    assert seen == [("/services/gpuspawner-admin/api/status", "token good")]
    assert out.startswith("GPU pool\nGPU type")
    assert "NVIDIA H100 (h100)" in out and "big" in out and "user rule 'hog'" in out


def test_json_for_one_user(service, capsys):
    url, seen = service
    assert (
        cli.main(["status", "--hub-url", url, "--token", "good", "--json", "--user", "student"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert seen[0][0] == "/services/gpuspawner-admin/api/status?user=student"
    assert [u["name"] for u in data["users"]] == ["student"]
    assert data["users"][0]["rule"] == "group rule 'students'"
    assert {t["key"] for t in data["types"]} == {"a100", "h100"}


def test_user_explained(service, capsys):
    url, _ = service
    assert cli.main(["status", "--hub-url", url, "--token", "good", "--user", "hog"]) == 0
    out = capsys.readouterr().out
    assert (
        "hog (groups: none) may hold unlimited GPUs, from user rule 'hog'; holds 4 GPUs now.\n"
        "hog may use the images PyTorch and MATLAB (groups 'licensed'; users 'hog').\n" in out
    )
    assert cli.main(["status", "--hub-url", url, "--token", "good", "--user", "nobody"]) == 1
    assert "the hub has no user 'nobody'" in capsys.readouterr().err


def test_refused_token(service, capsys):
    url, _ = service
    assert cli.main(["status", "--hub-url", url, "--token", "bad"]) == 1
    err = capsys.readouterr().err
    assert "custom:gpuspawner:admin" in err and "Traceback" not in err


def test_no_token_and_no_hub(monkeypatch, capsys):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    assert cli.main(["status", "--hub-url", "http://127.0.0.1:9"]) == 2
    assert "needs an API token" in capsys.readouterr().err
    assert cli.main(["status", "--hub-url", "http://127.0.0.1:9", "--token", "t"]) == 1
    assert "could not be reached" in capsys.readouterr().err


def test_cluster_queues_beside_the_pool(users, pods, figures, catalog, now, capsys, monkeypatch):
    """What the service's JSON holds of Kueue comes out as a table after the pool's, and in --json."""
    notebooks = kueueobjects.cluster_queue(
        "notebooks", [(A100, GPU, 4, None)], used={(A100, GPU): 3}, pending=1
    )
    queues = KueueData(
        names=("notebooks",),
        cluster_queues={"notebooks": notebooks},
        flavors=tuple(kueueobjects.flavors()),
        pending={"notebooks": [kueueobjects.workload("j", "w", [(2, {GPU: 1}, {})])]},
    )
    report = build_report(
        users=users, pods=pods, figures=figures, catalog=catalog, now=now, queues=queues
    )
    # through the JSON, as the service sends it
    sent = json.loads(json.dumps(report.as_dict()))
    monkeypatch.setattr(cli, "fetch_from_service", lambda *a: report_from_dict(sent))
    assert cli.main(["status", "--token", "t"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("Cluster queues (Kueue)")
    assert lines[start + 1].split()[:3] == ["cluster", "queue", "cohort"]
    assert lines[start + 3].split() == [
        "notebooks", "gpus", A100, "NVIDIA", "A100", "(a100)", GPU, "4", "none", "3", "3", "1", "2",
    ]  # fmt: skip
    assert cli.main(["status", "--token", "t", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kueue"][0]["pending_gpus"] == 2 and data["kueue_cluster_queues"] == ["notebooks"]


def test_cluster_queues_when_reading_the_cluster_directly(monkeypatch, capsys):
    asked = []

    async def fetch_direct(*args):
        asked.append(args)
        return build_report(users=[], pods=[], figures={}, catalog=None, now=0)

    monkeypatch.setattr(cli, "fetch_direct", fetch_direct)
    argv = ["status", "--token", "t", "--catalog", "c.yaml", "--kueue-cluster-queue", "notebooks"]
    assert cli.main([*argv, "--kueue-cluster-queue", "batch"]) == 0
    assert asked[-1][-1] == ("notebooks", "batch")
    assert cli.main(argv[:5]) == 0
    assert asked[-1][-1] == ()


# ---------------------------------------------------------------------------
# gpuspawner usage: from a real SQLite store
# ---------------------------------------------------------------------------


def utc(*args: int) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


def november() -> list[Interval]:
    """November 2026: ann 2 × A100 for 10 h, student 1 × H100 for 2 h, a slice (1/7) for 7 h."""
    return [
        Interval(
            "u1",
            "ann",
            "",
            "ml",
            "a100",
            "pytorch",
            2,
            2.0,
            utc(2026, 11, 2, 8),
            utc(2026, 11, 2, 18),
            "pod",
        ),
        Interval(
            "u2",
            "student",
            "",
            "students",
            "h100",
            "pytorch",
            1,
            1.0,
            utc(2026, 11, 3, 9),
            utc(2026, 11, 3, 11),
            "pod",
        ),
        Interval(
            "u3",
            "student",
            "x",
            "students",
            "mig",
            "jax",
            1,
            1 / 7,
            utc(2026, 11, 4),
            utc(2026, 11, 4, 7),
            "event",
        ),
        # December: outside --until 2026-11-30
        Interval(
            "u4",
            "ann",
            "",
            "ml",
            "a100",
            "pytorch",
            1,
            1.0,
            utc(2026, 12, 1, 1),
            utc(2026, 12, 1, 2),
            "pod",
        ),
    ]


@pytest.fixture
def db(usage_db, monkeypatch):
    monkeypatch.delenv("GPUSPAWNER_ACCOUNTING_DB_URL", raising=False)
    return usage_db(november())


def usage(*args: str) -> int:
    return cli.main(["usage", *args])


def test_usage_table_by_user_and_by_group(db, capsys):
    assert usage("--since", "2026-11-01", "--until", "2026-11-30", "--db", db) == 0
    assert capsys.readouterr().out == (
        "GPU usage 2026-11-01 00:00 to 2026-12-01 00:00 UTC, by user\n"
        "user     GPU-hours  weighted GPU-hours  servers\n"
        "-------  ---------  ------------------  -------\n"
        "ann      20.0       20.0                1\n"
        "student  9.0        3.0                 2\n"
        "total    29.0       23.0                3\n"
    )
    assert (
        usage(
            "--since", "2026-11-01", "--until", "2026-11-30", "--db", db, "--by", "group,gpu_type"
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == [
        "group",
        "GPU",
        "type",
        "GPU-hours",
        "weighted",
        "GPU-hours",
        "servers",
    ]
    assert [line.split()[:3] for line in out[3:]] == [
        ["ml", "a100", "20.0"],
        ["students", "mig", "7.0"],
        ["students", "h100", "2.0"],
        ["total", "29.0", "23.0"],
    ]


def test_usage_from_the_environment_for_a_group_as_csv(db, capsys, monkeypatch):
    monkeypatch.setenv("GPUSPAWNER_ACCOUNTING_DB_URL", db)
    assert (
        usage("--since", "2026-11-01", "--until", "2026-11-30", "--group", "students", "--csv") == 0
    )
    assert capsys.readouterr().out == (
        "user,gpu_seconds,gpu_hours,unit_seconds,unit_hours,servers\r\n"
        "student,32400,9,10800,3,2\r\n"
    )


def test_usage_intervals_are_the_pods_times(db, capsys):
    assert (
        usage("--since", "2026-11-03T10:00", "--until", "2026-11-30", "--intervals", "--db", db)
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "uid,user,server,group,gpu_type,image,gpus,start,end,seconds,gpu_seconds,end_source",
        # the part within the period: from 10:00
        "u2,student,,students,h100,pytorch,1,2026-11-03T09:00:00Z,2026-11-03T11:00:00Z,3600,3600,pod",
        "u3,student,x,students,mig,jax,1,2026-11-04T00:00:00Z,2026-11-04T07:00:00Z,25200,25200,event",
    ]


def test_usage_with_nothing_in_the_period(db, capsys):
    assert usage("--since", "2025-01-01", "--until", "2025-01-31", "--db", db) == 0
    assert capsys.readouterr().out.endswith(
        "total  0.0        0.0                 0\nNo GPU usage in this period.\n"
    )


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        ([], "gpuspawner usage needs the usage database: pass --db URL"),
        (["--db", "DB", "--since", "1 Nov"], "gpuspawner usage: The start '1 Nov' is not a date"),
        (
            ["--db", "DB", "--until", "2026-10-01"],
            "gpuspawner usage: The end 2026-10-02 00:00 UTC is not after",
        ),
        (
            ["--db", "DB", "--by", "user,pod"],
            "gpuspawner usage: Usage can be added up by user, group",
        ),
        (
            ["--db", "mysql://u:pw@h/db"],
            "gpuspawner usage: GPU usage is kept in SQLite or PostgreSQL, not 'mysql'",
        ),
        (["--db", "not a url"], "gpuspawner usage: 'not a url' is not a database URL: write it as"),
        (
            ["--db", "sqlite:////nonexistent/hub.sqlite"],
            "gpuspawner usage: There is no SQLite database at '/nonexistent/hub.sqlite'",
        ),
        (
            ["--db", "postgresql://gpu:s3cret@127.0.0.1:9/hub"],
            "gpuspawner usage: The usage database 'postgresql://gpu:***@127.0.0.1:9/hub' ",
        ),
    ],
)
def test_usage_refusals_are_one_sentence_with_status_2(db, capsys, monkeypatch, args, sentence):
    monkeypatch.delenv("GPUSPAWNER_ACCOUNTING_DB_URL", raising=False)
    args = [db if a == "DB" else a for a in args]
    assert usage("--since", "2026-11-01", *args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.startswith(sentence), err
    assert err.count("\n") == 1 and "Traceback" not in err and "s3cret" not in err


def test_usage_on_a_database_without_the_tables(tmp_path, capsys):
    import sqlite3

    path = tmp_path / "jupyterhub.sqlite"
    sqlite3.connect(path).close()
    assert usage("--since", "2026-11-01", "--db", f"sqlite:///{path}") == 2
    assert "has no GPU-hours tables yet: the hub creates them" in capsys.readouterr().err


def test_usage_help(capsys):
    with pytest.raises(SystemExit) as e:
        usage("--help")
    assert e.value.code == 0
    out = capsys.readouterr().out
    for option in ("--since", "--until", "--group", "--by", "--csv", "--intervals", "--db"):
        assert option in out
    assert "GPUSPAWNER_ACCOUNTING_DB_URL" in out and "gpuspawner usage --since 2026-11-01" in out
