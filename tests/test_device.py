"""The device policy (``stealkit.device``, ``--device`` on every command) and "tensors follow the model".

Without a GPU the cuda paths run on a simulated ``cuda:0`` (tests/fake_cuda.py) that raises torch's own
device-mismatch errors, so the commands that crashed on an H100 (issue 15: ``extract baseline``, ``extract
exact``, ``attack study``, ``reproduce --scale full``) fail here too when a tensor stays behind. The tier on a
real GPU is tests/test_gpu.py (``-m gpu``).
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
import torch

from stealkit.cli import cli, main
from stealkit.device import device_info, resolve_device
from stealkit.errors import InputError
from tests import test_report_kinds as kinds
from tests.fake_cuda import fake_cuda, on_fake_cuda

models = kinds.models  # module-scoped fixture: digits mlp2 victim (hidden 16) and substitute (hidden 8)

#: commands beyond the report-kind table whose cuda paths differ (attack kinds, knockoff selection)
EXTRA_RUNS: dict[str, list[str]] = {
    "attack pgd": ["attack", "pgd", "--substitute", kinds.SUBSTITUTE, "--victim", kinds.VICTIM, "--n", "20",
                   "--steps", "3"],
    "attack cw": ["attack", "cw", "--substitute", kinds.SUBSTITUTE, "--victim", kinds.VICTIM, "--n", "10",
                  "--steps", "3"],
    "attack boundary": ["attack", "boundary", "--victim", kinds.VICTIM, "--n", "2", "--budget", "200"],
    "extract surrogate knockoff": ["extract", "surrogate", "--victim", kinds.VICTIM, "--budget", "60", "--epochs",
                                   "2", "--student", "mlp2", "--student-arg", "hidden=8", "--strategy", "knockoff"],
}
#: every command run on the (simulated or real) GPU: name -> (arguments before --out, slow?)
_SLOW = {"extract maze", "extract dast", "extract codfe"}  # over 10 s on the simulated GPU (2 shared cores)
DEVICE_RUNS: dict[str, tuple[list[str], bool]] = {
    **{k: (args, slow or k in _SLOW) for k, (args, slow) in kinds.RUNS.items() if k != "demo"},
    **{k: (v, False) for k, v in EXTRA_RUNS.items()}}


def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)


# -- the policy ------------------------------------------------------------------------------------------------


def test_auto_is_the_cpu_without_a_gpu_and_cuda_0_with_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STEALKIT_DEVICE", raising=False)
    _cpu_only(monkeypatch)
    assert resolve_device("auto") == resolve_device(None) == "cpu"
    assert device_info() == {"device": "cpu"}
    monkeypatch.undo()
    with fake_cuda():
        assert resolve_device("auto") == resolve_device("CUDA") == "cuda:0"
        assert device_info()["gpu"].startswith("fake GPU")


def test_the_environment_variable_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEALKIT_DEVICE", "cpu")
    assert resolve_device(None) == "cpu"
    monkeypatch.setenv("STEALKIT_DEVICE", "gpu")
    with pytest.raises(InputError, match=r"\$STEALKIT_DEVICE 'gpu': unknown device"):
        resolve_device(None)


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "cuda0", "cuda:-1", "tpu", "cpu:0"])
def test_unknown_spellings_are_refused(spec: str) -> None:
    with pytest.raises(InputError, match="expected auto, cpu, cuda, cuda:N or mps"):
        resolve_device(spec)


def test_cuda_that_cannot_be_used_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu_only(monkeypatch)
    with pytest.raises(InputError, match="CPU-only build"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(InputError, match="sees no GPU"):
        resolve_device("cuda:0")
    monkeypatch.undo()
    with fake_cuda(), pytest.raises(InputError, match="no GPU 1; this machine has 1"):
        resolve_device("cuda:1")


def test_the_cli_says_it_in_one_line_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _cpu_only(monkeypatch)
    out = tmp_path / "m"
    assert main(["train", "--dataset", "digits", "--out", str(out), "--device", "cuda:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --device cuda:1: this torch") and "\n" not in err
    assert not out.exists()
    monkeypatch.setenv("STEALKIT_DEVICE", "cuda")
    assert main(["train", "--dataset", "digits", "--out", str(out)]) == 2
    assert "$STEALKIT_DEVICE cuda" in capsys.readouterr().err


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out |= _commands(cmd, f"{prefix}{name} ")
        else:
            out[prefix + name] = cmd
    return out


def test_every_command_that_computes_takes_device_default_auto() -> None:
    no_compute = {"study list", "report"}
    for name, cmd in _commands(cli).items():
        opts = {o: p for p in cmd.params for o in getattr(p, "opts", [])}
        if name in no_compute:
            continue
        assert "--device" in opts, f"{name} has no --device"
        assert opts["--device"].default == "auto", name
    assert {"run", "sweep", "reproduce", "serve", "demo"} <= set(_commands(cli))


# -- run / sweep / reproduce pass the device to their steps ----------------------------------------------------


def test_runner_passes_the_device_to_every_step_that_takes_one(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from stealkit.experiments import runner
    from stealkit.experiments.config import parse_config

    calls: list[list[str]] = []

    def record(argv: list[str], step_id: str, command: str) -> None:
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "summary.json").write_text("{}")

    monkeypatch.setattr(runner, "_invoke", record)
    cfg = parse_config({"name": "t", "step": [
        {"id": "a", "command": "train", "args": {"dataset": "digits"}},
        {"id": "b", "command": "train", "args": {"dataset": "digits", "device": "cpu"}},
        {"id": "c", "command": "report", "args": {}}]})
    runner.run_experiment(cfg, tmp_path / "run", device="cuda:3")
    a, b, c = calls
    assert a[a.index("--device") + 1] == "cuda:3"
    assert b[b.index("--device") + 1] == "cpu" and b.count("--device") == 1  # a step's own choice stands
    assert "--device" not in c  # report takes none
    assert json.loads((tmp_path / "run" / "experiment.json").read_text())["device"] == "cuda:3"
    calls.clear()
    runner.run_experiment(cfg, tmp_path / "run", device="cpu")
    assert calls == []  # the device is no part of a step's fingerprint: finished steps stay finished


def test_reproduce_and_sweep_trials_hand_the_device_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stealkit.experiments import reproduce, runner, sweep
    from stealkit.experiments.config import parse_config

    seen: list[str] = []

    def record(argv: list[str], step_id: str, command: str) -> None:
        seen.append(argv[argv.index("--device") + 1])
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "summary.json").write_text("{}")

    monkeypatch.setattr(runner, "_invoke", record)
    toml = tmp_path / "tiny.toml"
    toml.write_text('name = "tiny"\n[[step]]\nid = "a"\ncommand = "train"\nargs = { dataset = "digits" }\n')
    monkeypatch.setattr(reproduce, "config_paths", lambda scale: [toml])
    summary = reproduce.reproduce("full", tmp_path / "rep", device="cuda:2")
    assert summary["device"] == "cuda:2" and not summary["failed"]
    sweep.run_trial(parse_config({"name": "t", "step": [{"command": "train", "args": {"dataset": "digits"}}]})
                    .to_dict(), {"seed": 1}, str(tmp_path / "trial"), "cuda:1")
    assert seen == ["cuda:2", "cuda:1"]


def test_full_scale_configs_take_the_device_from_the_command_line() -> None:
    from stealkit.experiments.reproduce import config_paths

    paths = config_paths("full")
    assert paths
    for p in paths:
        assert "cuda" not in p.read_text(), f"{p.name} hard-codes a device"


# -- tensors follow the model (on a simulated GPU) --------------------------------------------------------------


def test_the_simulated_gpu_raises_what_cuda_raises() -> None:
    with fake_cuda():
        model = torch.nn.Linear(4, 2).to("cuda")
        assert on_fake_cuda(next(model.parameters())) and next(model.parameters()).device.type == "cuda"
        with pytest.raises(RuntimeError, match="same device"):
            model(torch.rand(3, 4))
        with pytest.raises(RuntimeError, match="device type for generator"):
            torch.randn(3, generator=torch.Generator().manual_seed(0), device="cuda")
        with pytest.raises(TypeError, match="numpy"):
            model(torch.rand(3, 4, device="cuda")).detach().numpy()
        assert not on_fake_cuda(model(torch.rand(3, 4).cuda()).cpu())


def test_evaluation_runs_on_the_device_of_the_model_it_scores(tiny_model: torch.nn.Module,
                                                              tiny_batch: torch.Tensor) -> None:
    from stealkit.metrics import Evaluator, predict_labels

    y = torch.arange(12) % 3
    on_cpu = Evaluator(tiny_batch, y, predict_labels(tiny_model, tiny_batch))(tiny_model)
    with fake_cuda():
        ev = Evaluator(tiny_batch, y, predict_labels(tiny_model, tiny_batch), device="cuda:0")
        assert ev(tiny_model) == on_cpu  # a student left on the CPU (extract baseline's crash)
        tiny_model.to("cuda")
        assert ev(tiny_model) == on_cpu
        assert Evaluator(tiny_batch, y, predict_labels(tiny_model, tiny_batch))(tiny_model) == on_cpu
        tiny_model.cpu()


def test_relative_error_feeds_each_model_on_its_own_device(tiny_model: torch.nn.Module,
                                                           tiny_batch: torch.Tensor) -> None:
    import copy

    from stealkit.extract.explanations.exact import relative_error

    other = copy.deepcopy(tiny_model).double()
    with torch.no_grad():
        other.net[1].bias.add_(0.01)
    expected = relative_error(tiny_model.double(), other, tiny_batch)
    assert expected > 0
    with fake_cuda():
        tiny_model.to("cuda")  # the victim on the GPU, the recovered model on the CPU (extract exact's crash)
        assert relative_error(tiny_model, other, tiny_batch) == pytest.approx(expected, rel=1e-12)
    tiny_model.cpu().float()


def command_args(kind: str, models: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The arguments of ``DEVICE_RUNS[kind]`` (before ``--out``), run from the checkout's root, where the
    standard victims are cached (runs/victims)."""
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    return [a.format(**models) for a in DEVICE_RUNS[kind][0]]


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if slow else k
                                  for k, (_, slow) in DEVICE_RUNS.items()])
def test_every_command_runs_on_a_simulated_gpu(kind: str, models: dict[str, str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    args, out = command_args(kind, models, monkeypatch), tmp_path / "run"
    with fake_cuda():
        assert cli.main(args=["-q", *args, "--out", str(out), "--device", "cuda"], prog_name="stealkit",
                        standalone_mode=False) in (None, 0)
    config = json.loads((out / "config.json").read_text())
    assert config["device"] == "cuda:0" and config["gpu"].startswith("fake GPU")


@pytest.mark.slow
def test_stn_study_every_part_on_a_simulated_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``reproduce --scale full`` ran stn-certified-robustness into a device mismatch in Table 1's attacks."""
    from dataclasses import replace

    from stealkit.studies.stn_certify import StudyConfig, run_study

    monkeypatch.setenv("STEALKIT_CACHE", str(tmp_path))
    cfg = replace(StudyConfig.for_dataset("digits", quick=True), sigmas=(0.5,), baselines=("pgd",), epochs=1,
                  num_certify=4, n=40, n0=10, num_attack=4, l2_eps=(0.0, 0.5), linf_eps=(0.0, 0.1),
                  soundness_num=2, boundary_steps=3, cw_steps=2)
    rows: list[dict[str, object]] = []
    with fake_cuda():
        summary = run_study(cfg, record=rows.append, device="cuda:0",
                            parts=("certify", "ablation", "table1", "empirical", "soundness"))
    assert summary["soundness"]["attacked"] >= 1 and {r["part"] for r in rows} >= {"table1", "empirical"}


def test_the_float64_oracle_answers_from_the_device_of_its_model(tiny_model: torch.nn.Module,
                                                                 tiny_batch: torch.Tensor) -> None:
    from stealkit.oracle.float64 import Float64ExplanationOracle

    on_cpu = Float64ExplanationOracle(tiny_model, (1, 4, 4))
    expected = on_cpu.query(tiny_batch), on_cpu.explain(tiny_batch, "smoothgrad", target=1, n_samples=2)
    with fake_cuda():
        oracle = Float64ExplanationOracle(tiny_model.to("cuda"), (1, 4, 4))
        answers = oracle.query(tiny_batch), oracle.explain(tiny_batch, "smoothgrad", target=1, n_samples=2)
    for got, want in zip(answers, expected, strict=True):
        assert not on_fake_cuda(got) and torch.equal(got, want)
    tiny_model.cpu()
