"""gpuspawner_sandbox.suitecosts: expensive steps recorded for the suite's time table."""

from __future__ import annotations

import json

import pytest

from gpuspawner_sandbox import suitecosts


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_step_is_one_line_with_its_kind_words_and_times(tmp_path, monkeypatch):
    record = tmp_path / "steps.jsonl"
    monkeypatch.setenv(suitecosts.ENV, str(record))
    with suitecosts.step(suitecosts.KUEUE, "preemption on"):
        pass
    (line,) = lines(record)
    assert (line["kind"], line["what"], line["ok"]) == ("Kueue deploy", "preemption on", True)
    assert line["end"] >= line["start"] > 0


def test_a_failed_step_is_recorded_as_failed_and_its_error_goes_on(tmp_path, monkeypatch):
    record = tmp_path / "steps.jsonl"
    monkeypatch.setenv(suitecosts.ENV, str(record))

    @suitecosts.recorded(suitecosts.HUB, lambda workdir: f"hub in {workdir}")
    def start(workdir):
        raise RuntimeError("no hub")

    with pytest.raises(RuntimeError, match="no hub"):
        start("w")
    (line,) = lines(record)
    assert (line["kind"], line["what"], line["ok"]) == ("hub start", "hub in w", False)


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(suitecosts.ENV, raising=False)
    monkeypatch.chdir(tmp_path)

    @suitecosts.recorded(suitecosts.IMAGE_BUILD)
    def build():
        return "built"

    assert build() == "built"
    assert list(tmp_path.iterdir()) == []


def test_a_record_that_cannot_be_written_does_not_fail_the_step(tmp_path, monkeypatch):
    monkeypatch.setenv(suitecosts.ENV, str(tmp_path / "missing-folder" / "steps.jsonl"))
    with suitecosts.step(suitecosts.GO_BUILD, "k8s"):
        pass
