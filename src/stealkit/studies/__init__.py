"""Every paper study stealkit reproduces, one module each, and the registry that names them.

Each study module holds, next to each other: ``NAME`` (its registry name), ``KIND`` (the run kind recorded in
``config.json``), ``SOURCE`` (the paper and its table or figure), the paper's numbers as data, a frozen ``Config``
dataclass, ``run(config, on_record=None) -> summary`` and ``sections(run, config, summary)`` for its report.
:mod:`stealkit.studies.registry` maps names to modules; the CLI (``stealkit study``, ``attack study``,
``certify-study``, ``defences``), ``stealkit reproduce`` and the benchmarks read it.
"""
