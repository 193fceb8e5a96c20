"""Remove each defence of ``stealkit serve`` in turn and check that a named test then fails (issue 51).

Where ``tools/mutation.py`` flips operators at random, this removes one *mechanism* at a time, by a text edit
of its source (the edit must match exactly once, so a refactor that moves the code fails loudly here), and runs
the tests that claim to guard it against a copy of ``src/``, with :func:`mutation.run_one` (a forked pytest
that imports stealkit from the copy; a live ``stealkit serve`` started by the tests does too, through
``PYTHONPATH``). A removal is *caught* when its tests fail (or run past the limit), *missed* when they pass.

    PYTHONPATH=src python tools/serve_mechanisms.py                  # every mechanism
    PYTHONPATH=src python tools/serve_mechanisms.py eviction idempotency-first
    PYTHONPATH=src python tools/serve_mechanisms.py --list
    PYTHONPATH=src python tools/serve_mechanisms.py --baseline       # first check the tests pass unmodified

Prints one row per mechanism and exits non-zero if any removal was missed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation import ROOT, run_one, src_copy  # noqa: E402 - the project's mutation runner, beside this file

HARD, I51, CAPS = "tests/test_serve_hard.py", "tests/test_serve_issue51.py", "tests/test_serve_caps.py"
CANCEL, JUNK = "tests/test_serve_cancel.py", "tests/test_serve_v2_junk.py"


@dataclass(frozen=True)
class Removal:
    name: str
    path: str  # under src/stealkit/serve/
    old: str
    new: str
    tests: tuple[str, ...]


REMOVALS = (
    Removal("header-deadline", "conn.py",
            "self._header_timer = self.loop.call_later(current().header_timeout, self._header_deadline)",
            "self._header_timer = None",
            (f"{HARD}::test_headers_that_never_finish_are_closed",)),
    Removal("drain-deadline", "conn.py",
            "self._drain_timer = self.loop.call_later(current().header_timeout, self._drain_deadline)",
            "pass",
            (f"{I51}::test_a_body_trickled_after_an_early_answer_is_cut_off",)),
    Removal("per-address-cap", "conn.py",
            "if state.per_host.get(group, 0) >= limits.per_address and not exempt:",
            "if False:",
            (f"{HARD}::test_one_address_holds_at_most_its_share_and_others_are_served",)),
    Removal("ipv6-/64-groups", "conn.py",
            "        return str(ipaddress.IPv6Network((addr, 64), strict=False))",
            "        return str(addr)",
            (f"{CAPS}::test_an_ipv6_client_holds_one_share_for_its_whole_64",)),
    Removal("eviction", "conn.py",
            "    if state.waiting:\n        victim",
            "    if False:\n        victim",
            (f"{CAPS}::test_a_full_cap_evicts_the_oldest_connection_without_headers",
             f"{CAPS}::test_half_open_connections_filling_the_cap_do_not_keep_a_tenant_out")),
    Removal("per-key-admission", "app.py",
            "if not quota.try_acquire(key.key_id):",
            "if not quota.try_acquire(key.key_id) and False:",
            (f"{HARD}::test_two_keys_at_their_share_leave_room_for_others",)),
    Removal("body-read-bound", "app.py",
            "BodyReads(max(1, max_inflight // 2))",
            "BodyReads(1 << 30, 0)",
            (f"{CAPS}::test_four_keys_trickling_bodies_leave_a_fifth_served",)),
    Removal("idempotency-first", "app.py",
            "if not service.known_retry(key, request.headers.get(\"idempotency-key\")):",
            "if True:",
            (f"{I51}::test_a_paid_answer_is_replayed_after_the_budget_is_spent",)),
    Removal("parse-outside-the-slot", "app.py",
            "                    compute = await gone.unless_gone(run_in_threadpool(scope, cancel, prepare, key, body), "
            "cancel)\n                    del body\n                    await gone.unless_gone(scheduler.acquire("
            "key.key_id),\n                                           undo=lambda _: scheduler.release(key.key_id))\n",
            "                    await scheduler.acquire(key.key_id)\n                    compute = await "
            "gone.unless_gone(run_in_threadpool(scope, cancel, prepare, key, body), cancel)\n",
            (f"{CANCEL}::test_a_parse_holds_no_compute_slot",)),
    Removal("queued-wait-cancelled", "app.py",
            "                    await gone.unless_gone(scheduler.acquire(key.key_id),\n"
            "                                           undo=lambda _: scheduler.release(key.key_id))\n",
            "                    await scheduler.acquire(key.key_id)\n",
            (f"{CANCEL}::test_a_client_that_leaves_while_queued_is_never_computed",)),
    Removal("refund-of-an-answer-its-client-left", "app.py",
            ", cancel,\n                                                          undo=_refund_unsent)",
            ", cancel)",
            (f"{CANCEL}::test_an_answer_finished_as_its_client_left_is_refunded",)),
    Removal("cancel-checks", "cancel.py",
            "    if event is not None and event.is_set():",
            "    if False:",
            (f"{CANCEL}::test_a_client_that_leaves_during_the_parse_stops_it",
             f"{CANCEL}::test_a_smoothgrad_whose_client_left_stops_and_is_refunded",
             f"{CANCEL}::test_the_json_reader_stops_at_its_next_window_once_cancelled")),
    Removal("model-cancel-check", "service.py",
            "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        check()\n",
            "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
            (f"{CANCEL}::test_a_smoothgrad_whose_client_left_stops_and_is_refunded",)),
    Removal("shared-failed-key-throttle", "authshare.py",
            "        return max(local, shared)",
            "        return local",
            ("tests/test_serve_authshare.py::test_failures_on_one_worker_throttle_the_others_and_a_restart",
             f"{I51}::test_failed_keys_on_one_worker_throttle_another")),
    Removal("v2-schema", "v2.py",
            "payloads.parse_json_object(head, schema=SCHEMA)",
            "payloads.parse_json_object(head, frozenset(SCHEMA))",
            (f"{JUNK}::test_the_v2_route_reads_its_body_with_the_schema",)),
)


def apply(text: str, r: Removal) -> str:
    if text.count(r.old) != 1:
        raise SystemExit(f"{r.name}: the text to remove occurs {text.count(r.old)} times in {r.path}, not once; "
                         "update tools/serve_mechanisms.py")
    return text.replace(r.old, r.new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="mechanisms to remove (default: all)")
    ap.add_argument("--list", action="store_true", help="print the removals and run nothing")
    ap.add_argument("--baseline", action="store_true", help="first run every named test on the unmodified code")
    ap.add_argument("--limit", type=float, default=600.0, help="seconds a removal's tests may run")
    args = ap.parse_args()
    chosen = [r for r in REMOVALS if not args.names or r.name in args.names]
    unknown = set(args.names) - {r.name for r in REMOVALS}
    if unknown:
        raise SystemExit(f"unknown mechanisms {sorted(unknown)}; known: {[r.name for r in REMOVALS]}")
    for r in chosen:  # every edit must apply before anything runs
        apply((ROOT / "src/stealkit/serve" / r.path).read_text(), r)
    if args.list:
        for r in chosen:
            print(f"{r.name}: serve/{r.path}: {r.old.strip()[:70]!r} -> {r.new.strip()[:40]!r}; {', '.join(r.tests)}")
        return
    sys.dont_write_bytecode = True
    import numpy  # noqa: F401 - the heavy imports once, before any fork
    import pytest  # noqa: F401
    import torch  # noqa: F401
    missed = []
    with src_copy("stealkit-mech-") as copy:
        if args.baseline:
            tests = tuple(dict.fromkeys(t for r in chosen for t in r.tests))
            outcome, seconds = run_one(tests, args.limit * 2)
            print(f"baseline: {outcome} ({seconds:.0f} s)", flush=True)
            if outcome != "survived":
                raise SystemExit("the tests fail on the unmodified code")
        print("| mechanism removed | tests | outcome | seconds |\n|---|---|---|---|", flush=True)
        for r in chosen:
            target = copy / "stealkit/serve" / r.path
            original = target.read_text()
            target.write_text(apply(original, r))
            try:
                outcome, seconds = run_one(r.tests, args.limit)
            finally:
                target.write_text(original)
            verdict = {"killed": "caught", "timeout": "caught (timeout)"}.get(outcome, "MISSED")
            if verdict == "MISSED":
                missed.append(r.name)
            print(f"| {r.name} | {', '.join(t.split('::')[1] for t in r.tests)} | {verdict} | {seconds:.0f} |",
                  flush=True)
    if missed:
        raise SystemExit(f"removals no test caught: {missed}")


if __name__ == "__main__":
    main()
