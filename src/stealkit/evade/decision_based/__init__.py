"""Decision-based attacks: adversarial examples from the victim's labels alone, every query metered.

Papers: Brendel et al., "Decision-Based Adversarial Attacks" (ICLR 2018, Boundary attack); Chen et al.,
"HopSkipJumpAttack" (IEEE S&P 2020); Wang et al., "Triangle Attack" (ECCV 2022). The validated ``tuned`` preset
adds best-of-N starts (Cheng et al. 2019), CGBA's semicircle search (ICCV 2023), orthogonal probes (Choromanski
et al. 2018), GeoDA's budget allocation (CVPR 2020) and, with a stolen substitute, QEBA-S subspace probes and
the P-RGF prior (Cheng et al. 2019).

Entry points: :func:`~stealkit.evade.decision_based.boundary.boundary_attack`,
:func:`~stealkit.evade.decision_based.hopskipjump.hopskipjump`, :func:`~stealkit.evade.decision_based.triangle.triangle`.
Every query goes through :class:`~stealkit.evade.decision_based.decision.LabelAccess`.
"""
