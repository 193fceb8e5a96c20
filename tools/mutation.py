"""A small AST mutation runner over the modules whose guarantees matter most (issue 38; report: docs/mutation.md).

Each mutant is one operator change spliced into the source text of one function (the rest of the file stays
byte-identical): a comparison flipped (``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``in`` <-> ``not in``,
``is`` <-> ``is not``), ``+`` <-> ``-``, ``*`` <-> ``/``, an integer or float constant plus one, ``True`` <-> ``False``,
``and`` <-> ``or``, a ``not`` dropped, a returned value replaced by ``None``, or one statement deleted
(replaced by ``pass``). Mutants run one at a time against a copy of ``src/`` in a temporary folder: the runner
imports the heavy libraries once, then forks one child per mutant that imports ``stealkit`` from the copy and
runs the module's test files with ``pytest -x -q``. A mutant is *killed* when the tests fail, *survived* when
they pass, *timeout* when they run past the limit (counted as killed, as mutmut does).

    PYTHONPATH=src python tools/mutation.py                 # every module
    PYTHONPATH=src python tools/mutation.py ledger bounds   # some modules
    PYTHONPATH=src python tools/mutation.py --list ledger   # print the mutants, run nothing

Writes ``runs/mutation/<module>.json`` (every mutant and its outcome) and prints a table.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the unit tests of tests/test_guarantees_audit.py each audit module runs (no audit is run: a mutant takes seconds)
_AUDIT_TESTS: dict[str, tuple[str, ...]] = {
    "copies": ("test_q_at_is_the_ledgers_count_of_the_lowest_budget_that_reached_the_level",
               "test_q_at_tolerates_float32_rounding_and_no_more",
               "test_q_value_reached_not_reached_or_not_measured",
               "test_headline_one_row_per_cell_with_both_levels",
               "test_spread_over_seeds_counts_an_unreached_seed_above_its_top_rung",
               "test_spread_needs_two_measured_seeds_of_the_undefended_like_attacker",
               "test_best_copy_is_the_highest_fidelity_and_the_fewest_queries_on_a_tie",
               "test_spread_median_of_infinite_values_is_not_a_number",
               "test_a_gate_fails_only_below_n_and_passes_at_n",
               "test_the_tolerance_is_inclusive_and_the_gate_reads_its_own_level",
               "test_the_headline_orders_rungs_then_levels_across_cells"),
    "gate": ("test_a_gate_fails_only_below_n_and_passes_at_n",
             "test_an_unreached_level_passes_only_when_the_ladder_reaches_n_minus_one",
             "test_a_gate_reads_only_the_undefended_like_cells_of_its_answer_kind",
             "test_an_unmeasured_cell_never_passes_and_a_failure_beats_it",
             "test_exit_codes_fail_over_undecided_over_pass",
             "test_the_tolerance_is_inclusive_and_the_gate_reads_its_own_level",
             "test_a_gate_reads_fidelity_at_the_level_less_the_tolerance"),
    "plan": ("test_a_cap_below_the_smallest_rung_is_refused",
             "test_the_plan_never_exceeds_the_cap_and_drops_in_the_documented_order",
             "test_the_data_free_part_gets_the_rest_up_to_its_cap_and_is_left_out_below_500",
             "test_repeats_take_whole_ladders_of_what_is_left",
             "test_the_plan_total_and_its_notes_on_the_pool_and_the_default_defences",
             "test_the_room_kinds_take_what_the_ladder_and_attacks_leave"),
    "reconcile": ("test_reconcile_compares_the_servers_difference_kind_by_kind",
                  "test_the_ledgers_are_summed_over_the_parts",
                  "test_a_stopped_part_and_replayed_answers_are_accounted_for",
                  "test_a_server_without_a_count_or_a_changed_source_is_not_reconcilable",
                  "test_the_statistics_extension_is_compared_on_predictions_only",
                  "test_a_kind_missing_from_a_count_is_zero_there",
                  "test_replayed_answers_and_kinds_only_the_server_saw",
                  "test_a_server_that_does_not_answer_is_one_error_and_a_malformed_count_is_no_count"),
}

#: module -> (file, the functions mutated (qualified names; empty: all), the test files run)
MODULES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "ledger": ("src/stealkit/oracle/ledger.py", (),
               ("tests/test_guarantees_ledger.py", "tests/test_oracle.py")),
    "base": ("src/stealkit/oracle/base.py", ("check_explain_args", "explain_price", "validate_images"),
             ("tests/test_guarantees_base.py", "tests/test_oracle.py")),
    "bounds": ("src/stealkit/certify/bounds.py", (),
               ("tests/test_guarantees_certify.py", "tests/test_certify_bounds.py")),
    "confidence": ("src/stealkit/certify/confidence.py", (),
                   ("tests/test_guarantees_certify.py", "tests/test_certify_bounds.py")),
    "store": ("src/stealkit/serve/store.py",
              ("Usage.left", "Usage.explain_left", "Usage.remaining", "Usage.ledger", "Usage.as_dict", "Store.usage",
               "Store.reserve", "Store.settle", "Store.refund", "Store._refund", "Store.recover", "Store.charge",
               "Store.audit"),
              ("tests/test_guarantees_serve.py", "tests/test_serve_units.py", "tests/test_serve_charging.py")),
    "service": ("src/stealkit/serve/service.py",
                ("Query.n", "Query.cost", "Query.fingerprint", "Service.check_budget", "Service.reserve",
                 "Service.run", "SettleOnSend.__init__", "SettleOnSend.__call__", "check_request_id",
                 "check_finite", "encode", "_replay_headers"),
                ("tests/test_guarantees_serve.py", "tests/test_serve_units.py", "tests/test_serve_charging.py")),
    "selection": ("src/stealkit/extract/datafree/selection.py",
                  ("ExponentialAverage.__init__", "ExponentialAverage.update", "agreement", "HeldOutStore.__init__",
                   "HeldOutStore.add", "HeldOutStore.scalars", "HeldOutStore.load", "StudentSelector.__init__",
                   "StudentSelector.add", "StudentSelector.consider", "StudentSelector.beats",
                   "StudentSelector.tensors", "StudentSelector.scalars", "StudentSelector.load"),
                  ("tests/test_guarantees_selection.py",
                   *(f"tests/test_datafree_labelonly.py::{t}" for t in (
                       "test_selector_never_trades_its_student_for_a_worse_one",
                       "test_reservoir_store_keeps_rows_from_every_round_and_recent_store_only_the_last",
                       "test_selection_margin_keeps_the_snapshot_within_the_store_noise",
                       "test_a_selector_plugs_in_through_make_selector",
                       "test_exponential_average_moves_towards_the_weights",
                       "test_holdout_rows_are_paid_for_but_never_trained_on",
                       "test_curve_reports_the_selected_student_and_its_gap",
                       "test_selection_settings_are_checked")))),
    # the audit (issue 52): Q90/Q95, the gate, the plan's budget cap, the reconciliation with the server
    "copies": ("src/stealkit/audit/copies.py",
               ("measured", "q_value", "headline", "_median", "seed_spread", "best_copy"),
               tuple(f"tests/test_guarantees_audit.py::{t}" for t in _AUDIT_TESTS["copies"])),
    "qat": ("src/stealkit/audit/parts.py", ("q_at",),
            tuple(f"tests/test_guarantees_audit.py::{t}" for t in _AUDIT_TESTS["copies"])),
    "gate": ("src/stealkit/audit/gates.py", ("cell_verdict", "decide_gates", "exit_code"),
             tuple(f"tests/test_guarantees_audit.py::{t}" for t in _AUDIT_TESTS["gate"])),
    "plan": ("src/stealkit/audit/plan.py", ("Plan.queries", "make_plan"),
             tuple(f"tests/test_guarantees_audit.py::{t}" for t in _AUDIT_TESTS["plan"])),
    "reconcile": ("src/stealkit/audit/reconcile.py", ("reconcile", "_ledgers", "reconcile_audit", "v2_usage"),
                  (*(f"tests/test_guarantees_audit.py::{t}" for t in _AUDIT_TESTS["reconcile"]),
                   "tests/test_audit_reconcile.py")),
}

_CMP_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BIN_FLIP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div}


@dataclass
class Mutant:
    module: str
    function: str
    line: int
    operator: str
    original: str
    replacement: str
    start: int  # character offsets into the file's text
    end: int
    outcome: str = ""
    seconds: float = 0.0


def _offsets(text: str) -> list[int]:
    out, pos = [0], 0
    for line in text.splitlines(keepends=True):
        pos += len(line.encode("utf-8"))
        out.append(pos)
    return out


def _span(node: ast.AST, starts: list[int], raw: bytes) -> tuple[int, int]:
    """Byte offsets of a node (ast columns are UTF-8 byte offsets)."""
    return (starts[node.lineno - 1] + node.col_offset,  # type: ignore[attr-defined]
            starts[node.end_lineno - 1] + node.end_col_offset)  # type: ignore[attr-defined]


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _replacements(node: ast.AST) -> Iterator[tuple[str, ast.AST | str]]:
    """(operator name, mutated node or replacement text) for one node."""
    import copy

    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _CMP_FLIP:
                new = copy.deepcopy(node)
                new.ops[i] = _CMP_FLIP[type(op)]()
                yield f"compare {type(op).__name__}->{_CMP_FLIP[type(op)].__name__}", new
    elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_FLIP:
        new = copy.deepcopy(node)
        new.op = _BIN_FLIP[type(node.op)]()
        yield f"binop {type(node.op).__name__}->{type(new.op).__name__}", new
    elif isinstance(node, ast.BoolOp):
        new = copy.deepcopy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield f"boolop {type(node.op).__name__}->{type(new.op).__name__}", new
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "drop not", node.operand
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield "bool flip", ast.Constant(not node.value)
    elif isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        yield "constant +1", ast.Constant(node.value + 1)


def enumerate_mutants(name: str) -> tuple[list[Mutant], bytes]:
    path, wanted, _ = MODULES[name]
    raw = (ROOT / path).read_bytes()
    text = raw.decode("utf-8")
    tree = ast.parse(text)
    starts = _offsets(text)
    out: list[Mutant] = []
    for qual, fn in _functions(tree):
        if wanted and qual not in wanted:
            continue
        body = fn.body[1:] if fn.body and _is_docstring(fn.body[0]) else fn.body
        for stmt in body:
            for node in ast.walk(stmt):
                if isinstance(node, ast.JoinedStr):
                    continue
                if isinstance(node, ast.stmt) and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    if isinstance(node, ast.Return) and node.value is not None and not (
                            isinstance(node.value, ast.Constant) and node.value.value is None):
                        s, e = _span(node, starts, raw)
                        out.append(Mutant(name, qual, node.lineno, "return None", raw[s:e].decode(),
                                          "return None", s, e))
                    if isinstance(node, ast.Expr | ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Raise) \
                            and not _is_docstring(node):
                        s, e = _span(node, starts, raw)
                        out.append(Mutant(name, qual, node.lineno, "delete statement", raw[s:e].decode(),
                                          "pass", s, e))
                    continue
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    continue
                for op, new in _replacements(node):
                    s, e = _span(node, starts, raw)
                    rep = new if isinstance(new, str) else f"({ast.unparse(new)})"
                    out.append(Mutant(name, qual, node.lineno, op, raw[s:e].decode(), rep, s, e))
    # skip f-string internals: their nodes' offsets are unreliable before Python 3.12
    out = [m for m in out if raw[m.start:m.end].decode(errors="replace") == m.original]
    return out, raw


def _apply(raw: bytes, m: Mutant) -> bytes:
    return raw[:m.start] + m.replacement.encode() + raw[m.end:]


def _run_child(tests: tuple[str, ...]) -> int:
    import pytest

    args = [*tests, "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-W", "ignore"]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        return int(pytest.main(args))


def _test_digest(tests: tuple[str, ...]) -> str:
    import hashlib

    return hashlib.sha256(b"".join((ROOT / t.split("::")[0]).read_bytes() for t in tests)).hexdigest()


def run_one(tests: tuple[str, ...], limit: float) -> tuple[str, float]:
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child: a fresh import of stealkit from the mutated copy
        os.setpgid(0, 0)
        code = 3
        try:
            code = _run_child(tests)
        finally:
            os._exit(code)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return ("survived" if code == 0 else "killed"), time.monotonic() - t0
        if time.monotonic() - t0 > limit:
            with _suppress():
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - t0
        time.sleep(0.05)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


@contextlib.contextmanager
def src_copy(prefix: str) -> Iterator[Path]:
    """A copy of ``src/`` in a temporary folder named ``prefix...``, first on ``sys.path`` and in ``PYTHONPATH`` (so the
    forked children, and any process they start, import stealkit from it), with the project's root as the working
    folder; the folder is removed at the end."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(ROOT / "src", copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        sys.path.insert(0, str(copy))
        os.environ["PYTHONPATH"] = str(copy)
        os.chdir(ROOT)
        yield copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", default=list(MODULES))
    ap.add_argument("--list", action="store_true", help="print the mutants and run nothing")
    ap.add_argument("--only", type=int, nargs="*", help="run only these mutant indices (of one module)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "mutation")
    args = ap.parse_args()
    sys.dont_write_bytecode = True
    # the heavy imports once, before any fork; stealkit itself is never imported here
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    import scipy.stats  # noqa: F401
    import torch  # noqa: F401
    with src_copy("stealkit-mut-") as copy:
        args.out.mkdir(parents=True, exist_ok=True)
        rows = []
        for name in args.modules:
            path, _, tests = MODULES[name]
            tests = tuple(t for t in tests if (ROOT / t.split("::")[0]).exists())
            mutants, raw = enumerate_mutants(name)
            if args.list:
                for i, m in enumerate(mutants):
                    print(f"{name}[{i}] {m.function}:{m.line} {m.operator}: {m.original!r} -> {m.replacement!r}")
                continue
            target = copy / Path(path).relative_to("src")
            checked = _test_digest(tests)
            outcome, base = run_one(tests, 1800)
            if outcome != "survived":
                raise SystemExit(f"{name}: the tests fail on the unmutated code ({outcome})")
            limit = 3 * base + 30
            chosen = [mutants[i] for i in args.only] if args.only else mutants
            for m in chosen:
                if _test_digest(tests) != checked:  # a changed test was never run on the unmutated code
                    raise SystemExit(f"{name}: a test file changed during the run; run again")
                target.write_bytes(_apply(raw, m))
                m.outcome, m.seconds = run_one(tests, limit)
                target.write_bytes(raw)
                mark = "." if m.outcome != "survived" else "S"
                print(mark, end="", flush=True)
                if m.outcome == "survived":
                    print(f"\n  survived {name}[{mutants.index(m)}] {m.function}:{m.line} {m.operator}: "
                          f"{m.original!r} -> {m.replacement!r}", flush=True)
            counts = {k: sum(m.outcome == k for m in chosen) for k in ("killed", "timeout", "survived")}
            print(f"\n{name}: {len(chosen)} mutants, {counts}, baseline {base:.1f} s")
            (args.out / f"{name}.json").write_text(json.dumps(
                {"module": path, "tests": tests, "baseline_s": base, "counts": counts,
                 "mutants": [asdict(m) | {"index": mutants.index(m)} for m in chosen]}, indent=1))
            rows.append((name, len(chosen), counts))
        if rows:
            print("\n| module | mutants | killed | timed out | survived |\n|---|---|---|---|---|")
            for name, n, c in rows:
                print(f"| {name} | {n} | {c['killed']} | {c['timeout']} | {c['survived']} |")


if __name__ == "__main__":
    main()
