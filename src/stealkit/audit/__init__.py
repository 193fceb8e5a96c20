"""``stealkit audit`` as a library: how much does an API leak to model extraction, and what does a copy enable?

The audit runs the default surrogate recipe at a ladder of query budgets per answer kind and attacker, a data-free
attacker, the attacks a stolen copy enables, and the explanation attacks where the victim serves explanations;
fidelity against queries and Q90/Q95, the defence table and PRADA; one report. Entry point:
:func:`stealkit.audit.run.run_audit` with :class:`stealkit.audit.options.AuditOptions`. Layout: ``options`` (every
option and default), ``parts`` (the part and the :class:`~stealkit.audit.parts.PartKind` protocol), ``kinds/``
(one module per part kind, and the ``KINDS`` table), ``plan``, ``execute``, ``copies`` (Q90/Q95, the best copy),
``defences``, ``reconcile``, ``report``.
"""
