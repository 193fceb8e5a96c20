"""Gradient attacks on a white-box (usually stolen) model, and transfer of their examples to the victim.

Papers: Goodfellow et al. 2015 (FGSM), Kurakin et al. 2017 (BIM), Madry et al. 2018 (PGD), Dong et al. 2018
(MI-FGSM), Carlini & Wagner 2017 (C&W L2), Athalye et al. 2018 (expectation over transformation); transfer
evaluation as in CoDFe Tables 1-2.

Entry points: :func:`~stealkit.evade.gradient_based.gradient.gradient_attack` (and ``fgsm``/``bim``/``pgd``/``mifgsm``),
:func:`~stealkit.evade.gradient_based.cw.carlini_wagner_l2`, :class:`~stealkit.evade.gradient_based.eot.EOTModel` and
:func:`~stealkit.evade.gradient_based.transfer.transfer_attack`.
"""
