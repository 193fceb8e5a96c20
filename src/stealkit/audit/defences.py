"""The audit's defence table: what each serving choice buys.

For every serving choice the audit covers (probabilities, top-k, top-1 labels, and probabilities through each
output defence of :mod:`stealkit.serve.defences`), side by side:

- the **attacker's Q90** with data like the victim's: the audit's own extraction cell of that choice, each point
  a run through the (defended) oracle;
- the **cost to honest users**: the top-1 accuracy and the expected calibration error (Guo et al. 2017, 15
  equal-width bins) of what is served on the victim's test split, computed from the local model's logits as the
  oracle answers them (:func:`stealkit.serve.defences.served_calibration`): no audit query is spent;
- **PRADA** (Juuti et al. 2019, :class:`stealkit.serve.detection.Prada`, its default settings): after how many
  queries it flags each attack. Every part's queries and the victim's answers are watched as the oracle answers
  them (:mod:`stealkit.oracle.observe`), in order; nothing is queried again and no ledger is charged.

Without ``--defence``, a local victim whose probabilities are audited gets :data:`DEFAULT_DEFENCES`, on the
lowest and middle rungs of the ladder (:func:`defence_rungs`); ``--defence none`` turns them off.

``--defence am`` (``am:keep=0.9,nu=1000``) adds Adaptive Misinformation (Kariyappa & Qureshi 2020,
:mod:`stealkit.serve.misinformation`): its misinformation network is trained on the victim's own training split
(a model directory stealkit trained records its data set and split) and ``tau`` is picked on that split, once per
audit process (:func:`build_defence`). A victim whose training data the audit cannot know has the cells left out
with a "not measured" note (:func:`measurable_defences`): it is never scored on data it was not trained on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stealkit.audit.parts import kind_of
from stealkit.errors import InputError

if TYPE_CHECKING:
    import torch

    from stealkit.oracle.victim import Target
    from stealkit.report.html import Section

#: the defences a local victim's audit adds when no ``--defence`` is given (justified in docs/guide/audit.md):
#: probabilities rounded to whole percentages, and Gaussian noise of 0.05 on each probability
DEFAULT_DEFENCES = ("round:decimals=2", "noise:sigma=0.05")
#: ``--defence none``: no default defence cells
OFF = "none"
WORDS = {"label": "top-1 label", "topk": "top-k probabilities (k={k})", "probs": "probabilities"}


def defence_rungs(rungs: Sequence[int]) -> list[int]:
    """The ladder of a default defence cell: the audit ladder's lowest and middle rungs (a ladder of one or two
    rungs whole). Defence cells are probability parts, the audit's slowest (about 150 CPU seconds each on
    Fashion-MNIST whatever the budget: the recipe's minimum of steps), so two rungs each: Q90 at the lowest, at
    the middle, or not reached within it."""
    rungs = sorted(rungs)
    return [rungs[0], rungs[len(rungs) // 2]] if len(rungs) > 2 else rungs


def resolve_defences(specs: Sequence[str], *, remote: bool, answers: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(explicit, default)`` defence cells: the ``--defence`` specs (``none`` dropped), and the default set when
    no ``--defence`` is given, the victim is local and its probabilities are audited (the defences act on
    probabilities; a remote victim's defences are its server's)."""
    explicit = list(dict.fromkeys(s for s in specs if s.strip().lower() != OFF))
    if specs or remote or "probs" not in answers:
        return explicit, []
    return explicit, list(DEFAULT_DEFENCES)


class PradaObserver:
    """An :mod:`stealkit.oracle.observe` observer feeding one part's answered queries, in order, to PRADA with the
    class each answer carries (what a server running PRADA for this client sees); it times itself."""

    def __init__(self) -> None:
        from stealkit.serve.detection import PradaConfig, PradaWatch

        self.watch = PradaWatch(PradaConfig())
        self.seconds = 0.0

    def __call__(self, oracle: Any, x: torch.Tensor, answer: torch.Tensor) -> None:
        from stealkit.oracle import labels_from_answer

        started = time.perf_counter()
        self.watch.observe(x.detach().cpu(), labels_from_answer(answer.detach().cpu(), oracle.mode))
        self.seconds += time.perf_counter() - started

    def as_dict(self) -> dict[str, Any]:
        return {**self.watch.as_dict(), "seconds": round(self.seconds, 2)}


def check_defence(spec: str) -> None:
    """Refuse a bad ``--defence`` spec before any work (``am`` specs too, which a keys file may not name)."""
    from stealkit.serve.defences import parse_defence
    from stealkit.serve.misinformation import is_am_spec, parse_am

    if is_am_spec(spec):
        parse_am(spec)
    else:
        parse_defence(spec)


def am_training_data(victim: Any, data_dir: str | None) -> tuple[Any, dict[str, Any]] | None:
    """The victim's own training split and recorded training recipe, or ``None`` where the audit cannot know
    them: only a model stealkit trained records its data set and split (``spec.extra``); an ONNX or TorchScript
    file, an ``nn.Module`` or a model of unknown provenance gets ``None`` (fail closed: never a stand-in set)."""
    extra = getattr(getattr(victim, "spec", None), "extra", None)
    if victim.model is None or not isinstance(extra, dict) or not extra.get("dataset"):
        return None
    from stealkit.data import load_splits

    splits = load_splits(str(extra["dataset"]), data_dir=data_dir, seed=int(extra.get("split_seed", 0)))
    if tuple(splits.victim_train.input_shape) != tuple(victim.input_shape):
        return None
    return splits.victim_train, dict(extra.get("train_config") or {})


AM_UNMEASURED = "not measured: adaptive misinformation needs the owner's training data"


def measurable_defences(specs: Sequence[str], target: Target) -> tuple[list[str], list[str]]:
    """``specs`` less the Adaptive Misinformation cells the audit cannot build (no known training data), and a
    plan note for each left out."""
    from stealkit.audit.parts import close
    from stealkit.serve.misinformation import is_am_spec

    if not any(is_am_spec(s) for s in specs):
        return list(specs), []
    v = target.open(mode="probs", budget=0)
    close(v)
    if am_training_data(v, target.data_dir) is not None:
        return list(specs), []
    left = [s for s in specs if is_am_spec(s)]
    return [s for s in specs if not is_am_spec(s)], [
        f"--defence {s} {AM_UNMEASURED} (only a model directory stealkit trained records its training split; "
        "fit stealkit.serve.misinformation.fit_adaptive_misinformation on yours in Python)" for s in left]


_BUILT: dict[tuple[Any, ...], Any] = {}


def build_defence(spec: str, target: Target, *, seed: int) -> Any:
    """The defence a spec names: :func:`~stealkit.serve.defences.parse_defence`'s, or for ``am`` the
    :class:`~stealkit.serve.misinformation.AdaptiveMisinformation` fitted to the victim's training split (``f_hat``
    trained with the victim's recorded batch size, ``tau`` on that split), seeded by the audit's
    ``seed``; built once per process and reused by every part and the serving costs."""
    from stealkit.serve.defences import parse_defence
    from stealkit.serve.misinformation import fit_adaptive_misinformation, is_am_spec, parse_am

    if not is_am_spec(spec):
        return parse_defence(spec)
    settings = parse_am(spec)
    key = (target.location, spec, seed, target.device, target.data_dir)
    if key not in _BUILT:
        v = target.open(mode="probs", budget=0)
        found = am_training_data(v, target.data_dir)
        if found is None or v.model is None:
            raise InputError(f"--defence {spec}: {AM_UNMEASURED}")
        train, recipe = found
        _BUILT[key] = fit_adaptive_misinformation(v.model, train.x, train.y, train.x, settings, seed=seed,
                                                  device=target.device,
                                                  batch_size=int(recipe.get("batch_size") or 64))
    return _BUILT[key]


def serving_costs(target: Target, *, answers: Sequence[str], defences: Sequence[str]
                  ) -> dict[str, dict[str, float]] | None:
    """Top-1 accuracy and ECE of each serving choice on the victim's test split, keyed ``label``, ``topk``,
    ``probs`` or ``probs+SPEC``; ``None`` for a remote victim (its test answers would cost queries). For Adaptive
    Misinformation also ``served f``: the share of test inputs it serves the model's own answer (a(x) < 1/2), and
    its ``tau``."""
    from stealkit.oracle.victim import is_url, victim_test
    from stealkit.serve.defences import served_calibration

    if isinstance(target.victim, str) and is_url(target.victim):
        return None
    v = target.open(mode="probs", budget=0)
    if v.model is None:
        return None
    top_k = target.top_k
    test = victim_test(v, target.data_dir)
    costs = {a: served_calibration(v.model, test.x, test.y, mode=a, top_k=top_k) for a in answers}
    for spec in defences:  # a fresh defence: seeded noise draws the same on every run
        defence = build_defence(spec, target, seed=target.seed)
        costs[f"probs+{spec}"] = served_calibration(v.model, test.x, test.y, mode="probs", defence=defence)
        if hasattr(defence, "alpha"):
            import torch

            probs = torch.softmax(v.oracle.logits(test.x), dim=1)  # type: ignore[attr-defined]
            costs[f"probs+{spec}"].update({"served f": float((defence.alpha(probs) < 0.5).double().mean()),
                                           "tau": defence.tau})
    return {k: {m: round(x, 6 if m == "tau" else 4) for m, x in c.items()} for k, c in costs.items()}


def flagged_text(prada: dict[str, Any] | None) -> int | str | None:
    """A part's PRADA column: the query count it flagged at, or "not flagged within N"."""
    if not prada:
        return None
    if prada.get("flagged_at") is not None:
        return int(prada["flagged_at"])
    return f"not flagged within {int(prada['queries']):,}"


def _longest(results: Sequence[dict[str, Any]], answers: str, attacker: str, defence: str) -> dict[str, Any] | None:
    cell = [r for r in results if kind_of(r) == "extract" and r["part"]["answers"] == answers
            and r["part"]["attacker"] == attacker and (r["part"].get("defence") or "") == defence]
    return max(cell, key=lambda r: r["part"]["budget"]) if cell else None


#: the answers an attacker can derive from what is served: top-k and labels from probabilities, labels from top-k
DERIVABLE = {"probs": ("probs", "topk", "label"), "topk": ("topk", "label"), "label": ("label",)}
#: the attacker each headline row measures, by the answers it trained on
RECIPES = {"probs": "probability recipe", "topk": "top-k recipe", "label": "label recipe"}


def best_q(rows: Sequence[dict[str, Any]], level: str = "Q90") -> dict[str, Any] | None:
    """The row whose ``level`` is lowest: a measured count beats "not reached within N" (the larger N the stronger
    the claim); a row not measured wins over neither and is returned only when nothing else was measured."""
    def rank(r: dict[str, Any]) -> tuple[int, int]:
        q = r.get(level)
        if isinstance(q, int):
            return (0, q)
        if isinstance(q, str) and q.startswith("not reached within "):
            return (1, -int(q.rsplit(" ", 1)[1].replace(",", "")))
        return (2, 0)

    return min(rows, key=rank) if rows else None


def serving_table(headline: Sequence[dict[str, Any]], results: Sequence[dict[str, Any]],
                  costs: dict[str, dict[str, float]] | None, top_k: int) -> list[dict[str, Any]]:
    """One row per serving choice: Q90 of the best attacker that can use what is served (data like the victim's:
    from probabilities also the top-k and the label recipes, from top-k the label recipe; through a defence, the
    probability recipe on the defended answers and the label recipe on their argmax), which attacker that was, the
    served top-1 accuracy and ECE, and PRADA's flag on the served cell's longest run (the largest rung)."""
    like = [h for h in headline if h["attacker"] == "like"]
    choices: list[tuple[str, str]] = []
    order = {"probs": 0, "topk": 1, "label": 2}
    for h in sorted(like, key=lambda h: (h.get("defence", "none") != "none", order.get(h["answers"], 3))):
        spec = "" if h.get("defence", "none") == "none" else h["defence"]
        served = "probs" if spec else h["answers"]  # a defence is worn by probabilities
        if (served, spec) not in choices:
            choices.append((served, spec))
    rows = []
    for served, spec in choices:
        if spec:
            attackers = [h for h in like if h.get("defence") == spec]
        else:
            attackers = [h for h in like if h.get("defence", "none") == "none" and h["answers"] in DERIVABLE[served]]
        best = best_q(attackers) or {}
        name = WORDS[served].format(k=top_k) + (f" through {spec}" if spec else "")
        cost = (costs or {}).get(f"probs+{spec}" if spec else served) or {}
        longest = _longest(results, served, "like", spec)
        recipe = RECIPES.get(best.get("answers", ""), "")
        if best and (best.get("answers") != served):
            recipe += " on the argmax" if best.get("answers") == "label" else " on the top k"
        rows.append({"serving": name, "attacker Q90": best.get("Q90"), "best attacker": recipe or None,
                     "served accuracy": cost.get("accuracy"), "ECE": cost.get("ece"),
                     "PRADA flagged at": flagged_text(longest.get("prada") if longest else None)})
    return rows


def _attack_name(r: dict[str, Any]) -> str:
    p = r["part"]
    kind = kind_of(r)
    if kind == "transfer":
        return "PGD transfer from the copy"
    if kind == "decision":
        return "HopSkipJump " + ("with the copy" if p.get("substitute") else "without a copy")
    if kind == "datafree":
        return "data-free (CoDFe, labels)"
    through = f" through {p['defence']}" if p.get("defence") else ""
    if p.get("defence") and p["answers"] == "label":
        through += " (its argmax)"
    data = {"like": "data like the victim's", "unrelated": "unrelated data"}.get(p["attacker"], p["attacker"])
    return f"extraction, {p['answers']}{through}, {data}"


def prada_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """PRADA on each attack the audit ran: every extraction cell's longest run and every other part."""
    rows = []
    seen = set()
    for r in results:
        p = r["part"]
        if not r.get("prada"):
            continue
        if kind_of(r) == "extract":
            key = (p["answers"], p["attacker"], p.get("defence") or "")
            if key in seen:
                continue
            seen.add(key)
            r = _longest(results, *key) or r
        rows.append({"attack": _attack_name(r), "part": r["id"], "queries": r["total_queries"],
                     "PRADA flagged at": flagged_text(r["prada"]), "W": r["prada"].get("statistic")})
    return rows


def serving_words(table: Sequence[dict[str, Any]], prada: Sequence[dict[str, Any]]) -> list[str]:
    """The report's opening sentences on calibration and PRADA."""
    out = []
    measured = [r for r in table if r.get("ECE") is not None]
    if measured:
        def what(r: dict[str, Any]) -> str:
            name = r["serving"]
            if name.startswith("probabilities through "):
                return "through " + name.removeprefix("probabilities through ")
            return "with " + name + (" alone (a bare label claims certainty)" if name == "top-1 label" else "")

        out.append("Calibration of what you serve (expected calibration error on your test split, lower is "
                   "better): " + ", ".join(f"{r['ECE']:.3f} {what(r)}" for r in measured) + ".")
    if prada:
        flagged = sorted((r for r in prada if isinstance(r["PRADA flagged at"], int)),
                         key=lambda r: r["PRADA flagged at"])
        free = [r for r in prada if not isinstance(r["PRADA flagged at"], int)]
        text = f"PRADA (its default settings) flags {len(flagged)} of the {len(prada)} attacks the audit ran"
        if flagged:
            text += ": " + "; ".join(f"{r['attack']} after {r['PRADA flagged at']:,} queries" for r in flagged[:3])
            text += f" and {len(flagged) - 3} more" if len(flagged) > 3 else ""
        if free:
            text += (f"; the other {len(free)} pass unflagged, the longest over "
                     f"{max(r['queries'] for r in free):,} queries")
        out.append(text + ".")
    return out


def misinformation_words(costs: dict[str, dict[str, float]] | None) -> list[str]:
    """A sentence per Adaptive Misinformation cell: its threshold, the share of honest inputs it leaves alone and
    the detector it uses."""
    from stealkit.serve.misinformation import is_am_spec

    out = []
    for key, c in (costs or {}).items():
        spec = key.removeprefix("probs+")
        if key.startswith("probs+") and is_am_spec(spec) and "served f" in c:
            out.append(f"Adaptive misinformation ({spec}; Kariyappa & Qureshi 2020): tau {c['tau']:.4g} on your "
                       f"model's maximum softmax probability (no Outlier Exposure: the paper's sharper detector is "
                       f"not trained), picked on its training split; it serves your model's own answer on "
                       f"{c['served f']:.1%} of your test inputs and the misinformation network's elsewhere, "
                       "where the argmax changes too, so the label attacker is measured on it, not assumed.")
    return out


def add_serving(summary: dict[str, Any], costs: dict[str, dict[str, float]] | None, top_k: int) -> None:
    """Put the serving table, the PRADA rows and their sentences into the audit's summary."""
    results = summary.get("parts") or []
    summary["serving"] = serving_table(summary.get("headline") or [], results, costs, top_k)
    summary["prada"] = prada_rows(results)
    summary.setdefault("sentences", []).extend(serving_words(summary["serving"], summary["prada"]))
    summary["sentences"].extend(misinformation_words(costs))
    if costs is None:
        summary.setdefault("notes", []).append(
            "served accuracy and ECE need the victim's answers on the test split, which a remote victim gives only "
            "for queries: not measured")


def serving_sections(summary: dict[str, Any]) -> list[Section]:
    """The report's defence table and PRADA table."""
    from stealkit.report.html import Section

    out = []
    if summary.get("serving"):
        out.append(Section("What each defence buys", paragraphs=[
            "One row per serving choice. Attacker Q90: the queries the attacker with data like yours needs for a "
            "90 % copy (each point a run of the default recipe through the oracle serving that choice). Served "
            "accuracy and ECE: the honest users' cost, the top-1 accuracy and the expected calibration error (15 "
            "equal-width bins) of what is served on your test split, computed from your model without a query; "
            "a top-1 label is scored with confidence 1.0, top-k with the largest probability it shows. PRADA "
            "flagged at: after how many of that cell's longest run's queries PRADA (default settings) flags it, "
            "tested after every query."], tables=[("", summary["serving"])]))
    if summary.get("prada"):
        out.append(Section("PRADA on each attack's queries", paragraphs=[
            "Juuti et al. 2019, Algorithm 1, with stealkit serve's default settings (Shapiro-Wilk W below 0.9 "
            "after 100 distances), fed each attack's own queries and your model's answers in the order they were "
            "answered, as a server watching that client would; W is the statistic at the flag (or at the end)."],
            tables=[("", summary["prada"])]))
    return out
