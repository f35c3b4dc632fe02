"""A rerun never silently replaces a previous run's results: a folder holding a checkpoint or a summary is
refused unless --resume or --overwrite says what to do with it."""

import json
import os

import pytest
import torch.multiprocessing as mp
from helpers import TINY, free_ports, read_metrics, train_run

from gradcomp.cli import main
from gradcomp.training.config import ConfigError, resolve_config
from gradcomp.training.train import _check_output_folder


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-step run (copied by the tests that change it)."""
    _, run_dir = train_run(tmp_path_factory.mktemp("finished"), "run", max_steps=2)
    return run_dir


def _copy(run_dir, destination):
    destination.mkdir()
    for path in run_dir.iterdir():
        (destination / path.name).write_bytes(path.read_bytes())
    return destination


def _contents(folder):
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_a_finished_run_is_refused_and_left_alone(tmp_path, finished):
    run_dir = _copy(finished, tmp_path / "run")
    before = _contents(run_dir)
    with pytest.raises(ConfigError) as refusal:
        train_run(tmp_path, "run", max_steps=3)
    message = str(refusal.value)
    assert "\n" not in message
    for part in (str(run_dir), "a finished run", "summary.json", "checkpoint.pt", "--resume", "--overwrite"):
        assert part in message
    assert _contents(run_dir) == before


def test_an_interrupted_run_is_refused(tmp_path, finished):
    run_dir = _copy(finished, tmp_path / "run")
    (run_dir / "summary.json").unlink()
    with pytest.raises(ConfigError, match=r"holds an interrupted run \(checkpoint.pt\); pass --resume"):
        train_run(tmp_path, "run", max_steps=3)


def test_resume_continues_an_interrupted_run(tmp_path, finished):
    run_dir = _copy(finished, tmp_path / "run")
    (run_dir / "summary.json").unlink()
    earlier = read_metrics(run_dir)
    summary, _ = train_run(tmp_path, "run", max_steps=4, resume=True)
    assert summary["steps"] == 4
    assert read_metrics(run_dir)[: len(earlier)] == earlier


def test_resuming_a_finished_probed_run_rewrites_its_summary_and_keeps_its_files(tmp_path):
    """What a pipeline job does when it runs again: every pair it trains resumes, finished ones too."""
    probe = {"every": 1, "kinds": ["gradient"], "reservoir": 64}
    _, run_dir = train_run(tmp_path, "run", max_steps=2, probe=probe)
    before = _contents(run_dir)
    summary, _ = train_run(tmp_path, "run", max_steps=2, probe=probe, resume=True)
    assert summary["steps"] == 2
    after = _contents(run_dir)
    assert after["probe.npz"] == before["probe.npz"] and after["metrics.jsonl"] == before["metrics.jsonl"]


def test_overwrite_deletes_the_run_files_only_and_starts_afresh(tmp_path, finished):
    run_dir = _copy(finished, tmp_path / "run")
    (run_dir / "probe.npz").write_bytes(b"a previous run's probe")
    (run_dir / "notes.txt").write_text("the user's own file")
    summary, _ = train_run(tmp_path, "run", max_steps=3, overwrite=True)
    assert summary["steps"] == 3
    assert [line["step"] for line in read_metrics(run_dir) if line["kind"] == "step"] == [2]  # log_every 2
    assert not (run_dir / "probe.npz").exists()  # this run does not probe
    assert (run_dir / "notes.txt").read_text() == "the user's own file"


@pytest.mark.parametrize("state", ["missing", "empty", "other files", "a failed start"])
def test_a_folder_without_results_is_used(tmp_path, state):
    out = tmp_path / "run"
    if state != "missing":
        out.mkdir()
    if state == "other files":
        (out / "notes.txt").write_text("")
    if state == "a failed start":  # config.yaml and an empty metrics.jsonl, no checkpoint yet
        (out / "config.yaml").write_text("")
        (out / "metrics.jsonl").write_text("")
    summary, _ = train_run(tmp_path, "run", max_steps=1)
    assert summary["steps"] == 1


def test_the_command_line_refuses_in_one_line(tmp_path, finished, capsys):
    run_dir = _copy(finished, tmp_path / "run")
    arguments = ["train", "--dataset", "synthetic", "--max-steps", "2", "--out", str(run_dir)]
    assert main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"gradcomp: error: {run_dir} holds a finished run") and error.count("\n") == 1
    with pytest.raises(SystemExit):  # argparse: one or the other
        main([*arguments, "--resume", "--overwrite"])
    with pytest.raises(ConfigError, match="resume and overwrite"):
        resolve_config(**TINY, resume=True, overwrite=True)
    # the config.yaml of a run started with --overwrite, continued with --resume (and the other way round)
    saved = tmp_path / "config.yaml"
    saved.write_text("dataset: synthetic\noverwrite: true\n")
    assert resolve_config(saved, resume=True).resume
    saved.write_text("dataset: synthetic\nresume: true\n")
    assert resolve_config(saved, overwrite=True).overwrite


def _rank(rank: int, port: int, folders: list[str], results: str) -> None:
    """Rank 0 sees the previous run's files, rank 1 does not (another machine's file system)."""
    from gradcomp.training.distributed import setup

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    processes, _ = setup("cpu")
    try:
        _check_output_folder(resolve_config(**TINY, out=folders[rank]), processes)
        outcome = "started"
    except ConfigError as error:
        outcome = str(error)
    finally:
        processes.close()
    with open(os.path.join(results, f"rank{rank}.json"), "w") as handle:
        json.dump(outcome, handle)


def test_every_rank_fails_the_same_way(tmp_path, finished):
    folders = [str(finished), str(tmp_path / "unseen")]
    mp.spawn(_rank, args=(free_ports(1)[0], folders, str(tmp_path)), nprocs=2)
    outcomes = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert outcomes[0] == outcomes[1] and outcomes[0].startswith(f"{finished} holds a finished run")
