from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from stealkit.errors import InputError
from stealkit.experiments.config import load_config, parse_config, to_argv
from stealkit.experiments.runner import run_experiment
from stealkit.experiments.sweep import expand_grid, parse_grid, run_sweep

TINY = textwrap.dedent("""
    name = "tiny"
    seed = 3

    [[step]]
    id = "victim"
    command = "train"
    args = { dataset = "digits", arch = "logistic", epochs = 8, batch_size = 64 }

    [[step]]
    id = "steal"
    command = "extract baseline"
    args = { victim = "${victim}", mode = "probs", budget = 60, checkpoints = [30, 60], student = "logistic", epochs = 10 }
""")


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_parse_and_argv(tiny_config):
    cfg = load_config(tiny_config)
    assert [s.id for s in cfg.steps] == ["victim", "steal"] and cfg.seed == 3
    argv = to_argv("extract baseline", {"budget": 10, "checkpoints": [5, 10], "student_arg": ["hidden=8"]})
    assert argv == ["extract", "baseline", "--budget", "10", "--checkpoints", "5,10", "--student-arg", "hidden=8"]
    assert to_argv("train", {"arch_arg": ["depth=8", "width=0.5"]}) == [
        "train", "--arch-arg", "depth=8", "--arch-arg", "width=0.5"]


@pytest.mark.parametrize("data, msg", [
    ({}, "at least one"),
    ({"step": [{"command": "fly"}]}, "unknown command"),
    ({"step": [{"command": "extract"}]}, "is a group"),
    ({"step": [{"command": "train", "args": {"x": "${nope}"}}]}, "not an earlier step"),
    ({"step": [{"command": "train", "budget": 3}]}, "unknown keys"),
    ({"stepz": []}, "unknown top-level"),
])
def test_config_errors(data, msg):
    with pytest.raises(InputError, match=msg):
        parse_config(data)


def test_bad_toml(tmp_path):
    (tmp_path / "x.toml").write_text("name = [")
    with pytest.raises(InputError, match="not valid TOML"):
        load_config(tmp_path / "x.toml")


def test_grid():
    grid = parse_grid(["seed=0,1", "steal.mode=probs,label"])
    assert grid == {"seed": [0, 1], "steal.mode": ["probs", "label"]}
    assert len(expand_grid(grid)) == 4
    with pytest.raises(InputError):
        parse_grid(["seed"])


def test_run_restart_skips_finished_steps(tiny_config, tmp_path):
    cfg = load_config(tiny_config)
    first = run_experiment(cfg, tmp_path / "run")
    assert [o.skipped for o in first] == [False, False]
    summary = json.loads((tmp_path / "run" / "steal" / "summary.json").read_text())
    assert summary["queries"]["predict"] == 60 and summary["seed"] == 3
    again = run_experiment(cfg, tmp_path / "run")
    assert [o.skipped for o in again] == [True, True]
    changed = cfg.with_value("steal.budget", 30).with_value("steal.checkpoints", [30])
    third = run_experiment(changed, tmp_path / "run")
    assert [o.skipped for o in third] == [True, False]


@pytest.mark.slow
def test_sweep_local_and_ray_identical(tiny_config, tmp_path):
    pytest.importorskip("ray")
    cfg = load_config(tiny_config)
    grid = {"steal.mode": ["probs", "label"]}
    local = run_sweep(cfg, grid, tmp_path / "local", backend="local", workers=2)
    ray = run_sweep(cfg, grid, tmp_path / "ray", backend="ray", workers=2)
    assert len(local) == len(ray) == 2
    for a, b in zip(local, ray, strict=True):
        assert a["values"] == b["values"]
        ra = (tmp_path / "local" / a["dir"].split("/")[-1] / "steal" / "records.jsonl").read_text()
        rb = (tmp_path / "ray" / b["dir"].split("/")[-1] / "steal" / "records.jsonl").read_text()
        assert ra == rb and ra.strip()
    assert local[0]["final"]["queries"] == {"predict": 60, "explain": 0}
    assert (tmp_path / "local" / "report.html").exists() and (tmp_path / "ray" / "report.html").exists()


def test_sweep_report_has_a_row_and_a_line_per_trial(tiny_config):
    from stealkit.experiments.sweep import sweep_report

    curve = [{"queries": 30, "accuracy": 0.4}, {"queries": 60, "accuracy": 0.5}]
    trials = [{"values": {"steal.mode": m}, "dir": m, "final": {"accuracy": 0.5, "curve": curve}}
              for m in ("probs", "label")]
    page = sweep_report(load_config(tiny_config), {"steal.mode": ["probs", "label"]}, trials)
    assert page.count("<td>probs</td>") == 1 and page.count("<td>label</td>") == 1
    assert "Every trial&#x27;s curve" in page and page.count("<img") == 1


@pytest.mark.parametrize("scale", ["small", "full"])
def test_packaged_reproduce_configs_parse(scale):
    from stealkit.experiments.reproduce import config_paths

    paths = config_paths(scale)
    names = [load_config(p).name for p in paths]
    assert len(names) == len(set(names))
    if scale == "small":
        assert len(paths) >= 5


def test_reproduce_lookup():
    from stealkit.experiments.reproduce import lookup

    summary = {"accuracy": 0.5, "curve": [{"queries": 10}, {"queries": 20}]}
    assert lookup(summary, "final.accuracy") == 0.5
    assert lookup(summary, "curve.-1.queries") == 20
    assert lookup(summary, "missing.key") is None
    dotted = {"acc": {"sigma=0.5": {"0.5": 0.21}}, "rows": [{"name": "a", "v": 1}, {"name": "b", "v": 2}]}
    assert lookup(dotted, "final.acc.sigma=0.5.0.5") == 0.21
    assert lookup(dotted, "rows.name=b.v") == 2
    assert lookup(dotted, "rows.name=c.v") is None


BROKEN = textwrap.dedent("""
    name = "broken"
    seed = 0

    [[step]]
    id = "steal"
    command = "extract baseline"
    args = { victim = "standard:no-such-victim", mode = "probs", budget = 10 }
""")


@pytest.mark.slow
def test_reproduce_reports_a_failed_study_and_runs_the_rest(tiny_config, tmp_path, monkeypatch):
    from stealkit.experiments import reproduce as rp

    broken = tmp_path / "broken.toml"
    broken.write_text(BROKEN)
    (tmp_path / "tiny.toml").write_text(TINY + '\n[[paper.rows]]\nresult = "r"\npaper = "-"\nours = "final.queries.predict"\n')
    monkeypatch.setattr(rp, "config_paths", lambda scale: [broken, tiny_config])
    summary = rp.reproduce("small", tmp_path / "out")
    assert summary["failed"] == ["broken"]
    by_name = {s["name"]: s for s in summary["studies"]}
    assert "no-such-victim" in by_name["broken"]["error"]
    tiny = by_name["tiny"]
    assert tiny["rows"][0]["ours"] == 60 and tiny["seconds"] > 0
    assert "Failed" in (tmp_path / "out" / "report.html").read_text()
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| broken | failed:" in md and "| tiny | r | - | 60 |" in md
    again = rp.reproduce("small", tmp_path / "out", only=("tiny",))  # finished steps keep their own times
    assert again["studies"][0]["skipped_steps"] == ["victim", "steal"]
    assert again["studies"][0]["seconds"] == tiny["seconds"]


def test_reproduce_lookup_several_keys_and_steps():
    from stealkit.experiments.reproduce import _row_value, lookup
    from stealkit.experiments.runner import StepOutcome

    reach = {"reach": [{"figure": 2, "kind": "membership", "q": 300}, {"figure": 2, "kind": "gradient", "q": 30}]}
    assert lookup(reach, "reach.figure=2&kind=gradient.q") == 30
    outcomes = [StepOutcome("a", "x", None, False, 1.0, {"v": 1}), StepOutcome("b", "y", None, False, 1.0, reach)]
    assert _row_value(outcomes, "a:v") == 1 and _row_value(outcomes, "final.reach.1.q") == 30
    assert _row_value(outcomes, "zz:v") is None


def test_reproduce_survives_an_internal_error(tiny_config, tmp_path, monkeypatch):
    from stealkit.experiments import reproduce as rp

    real = rp.run_experiment

    def flaky(cfg, out, force=False, device=None):
        if cfg.name == "tiny" and "boom" in str(out):
            raise RuntimeError("deep inside torch")
        return real(cfg, out, force=force, device=device)

    monkeypatch.setattr(rp, "run_experiment", flaky)
    monkeypatch.setattr(rp, "config_paths", lambda scale: [tiny_config])
    summary = rp.reproduce("small", tmp_path / "boom")
    assert summary["failed"] == ["tiny"]
    assert "internal error RuntimeError: deep inside torch" in summary["studies"][0]["error"]


@pytest.mark.slow
def test_reproduce_jobs_runs_studies_in_parallel_processes_with_the_same_results(tiny_config, tmp_path, monkeypatch):
    from stealkit.experiments import reproduce as rp

    second = tmp_path / "second.toml"
    second.write_text(TINY.replace('name = "tiny"', 'name = "second"'))
    monkeypatch.setattr(rp, "config_paths", lambda scale: [tiny_config, second])
    serial = rp.reproduce("small", tmp_path / "serial", jobs=1)
    parallel = rp.reproduce("small", tmp_path / "parallel", jobs=2)
    assert parallel["jobs"] == 2 and [s["name"] for s in parallel["studies"]] == ["tiny", "second"]
    for a, b in zip(serial["studies"], parallel["studies"], strict=True):
        sa = json.loads((Path(a["final_step"]) / "summary.json").read_text())
        sb = json.loads((Path(b["final_step"]) / "summary.json").read_text())
        assert sa["queries"] == sb["queries"] and sa["accuracy"] == sb["accuracy"]
    again = rp.reproduce("small", tmp_path / "parallel", jobs=2)  # finished steps are skipped on restart
    assert all(s["skipped_steps"] == ["victim", "steal"] for s in again["studies"])
    with pytest.raises(InputError, match="jobs"):
        rp.reproduce("small", tmp_path / "x", jobs=0)


def test_sweep_jobs_default_to_the_cores(tiny_config, tmp_path, monkeypatch):
    import os

    from click.testing import CliRunner

    import stealkit.experiments.sweep as sweep
    from stealkit.cli import cli

    seen = []
    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **kw: seen.append(kw["workers"]) or [])
    for extra, want in (([], os.cpu_count()), (["--jobs", "3"], 3), (["--workers", "1"], 1)):
        result = CliRunner().invoke(cli, ["sweep", str(tiny_config), "--grid", "seed=0,1", *extra,
                                          "--out", str(tmp_path / "s")])
        assert result.exit_code == 0, result.output
        assert seen[-1] == want


@pytest.mark.parametrize("scale", ["small", "full"])
def test_packaged_reproduce_steps_parse_against_the_cli(scale, tmp_path):
    """Every step of every packaged study is a valid command line (options exist, values convert), so a GPU
    run of ``reproduce --scale full`` cannot fail on a typo after minutes of device time."""
    import click

    from stealkit.cli import cli
    from stealkit.experiments.config import to_argv
    from stealkit.experiments.reproduce import config_paths

    for path in config_paths(scale):
        for step in load_config(path).steps:
            argv = to_argv(step.command, {**step.args, "out": str(tmp_path / step.id)})
            group: click.Command = cli
            ctx = None
            while isinstance(group, click.Group):
                name, argv = argv[0], argv[1:]
                group = group.get_command(click.Context(group), name)
                assert group is not None, f"{path.name}: unknown command {step.command!r}"
            ctx = group.make_context(step.command, list(argv), resilient_parsing=False)
            assert ctx.params, path


def test_full_scale_stn_is_the_papers_sizes():
    from stealkit.errors import InputError
    from stealkit.studies.stn_certify import StudyConfig

    full = StudyConfig.for_dataset("fashion-mnist", full=True)
    assert (full.n, full.n0, full.num_certify) == (100_000, 100, 500)
    assert full.sigmas == (0.25, 0.5, 0.7, 1.0) and full.main_sigma == 0.7
    small = StudyConfig.for_dataset("fashion-mnist")
    assert (small.n, small.num_certify) == (1000, 200)
    with pytest.raises(InputError, match="exclude"):
        StudyConfig.for_dataset("fashion-mnist", quick=True, full=True)
