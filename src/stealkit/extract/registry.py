"""The extraction methods by public name: run function, config dataclass, family and paper.

Families say how a method is called: ``pool`` methods query a pool of images
(``run(oracle, pool, make_student=..., evaluator=..., config=...)``), ``datafree`` methods make their own
queries with a generator (``run(oracle, make_student=..., evaluator=..., config=..., checkpoint_dir=...)``),
``exact`` methods recover the victim's parameters (``run(oracle, hidden, config, anchors=...)``, or
``run(oracle)`` for the logistic identification).

    from stealkit.extract.registry import METHODS
    method = METHODS["dfme"]
    result = method.run(oracle, make_student=make, evaluator=ev, config=method.config(seed=0))
"""

from __future__ import annotations

from stealkit.registry import Entry, Registry

_X = "stealkit.extract"

METHODS = Registry("extraction method", [
    Entry("baseline", f"{_X}.surrogate_data.baseline", "extract_baseline", "BaselineConfig", "pool", "-"),
    Entry("surrogate", f"{_X}.surrogate_data.surrogate", "extract_surrogate", "SurrogateConfig", "pool",
          "Truong et al. 2021, appendix A; Knockoff Nets (Orekondy et al. 2019) with strategy=knockoff"),
    Entry("gradient-matching", f"{_X}.explanations.gradient_matching", "extract_gradient_matching", "GradMatchConfig", "pool",
          "Milli et al. 2019, Sec. 4"),
    Entry("dfme", f"{_X}.datafree.dfme", "extract_dfme", "DFMEConfig", "datafree", "Truong et al. 2021"),
    Entry("maze", f"{_X}.datafree.maze", "extract_maze", "MAZEConfig", "datafree", "Kariyappa et al. 2021"),
    Entry("dast", f"{_X}.datafree.dast", "extract_dast", "DaSTConfig", "datafree", "Zhou et al. 2020"),
    Entry("codfe", f"{_X}.datafree.codfe", "extract_codfe", "CoDFeConfig", "datafree", "CoDFe"),
    Entry("exact-gradient", f"{_X}.explanations.exact", "recover_two_layer", "ExactConfig", "exact",
          "Milli et al. 2019, Sec. 3, Algorithm 1"),
    Entry("exact-mq", f"{_X}.explanations.exact_mq", "recover_two_layer_mq", "ExactConfig", "exact",
          "Milli et al. 2019, App. C (membership queries only)"),
    Entry("exact-logistic", f"{_X}.explanations.logistic_exact", "identify_logistic", None, "exact",
          "Milli et al. 2019, footnote 2"),
])

#: the data-free methods, in the order the CLI lists them
DATAFREE: tuple[str, ...] = METHODS.family("datafree")
