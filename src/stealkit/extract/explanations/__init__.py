"""Model reconstruction from explanations: gradients (or membership answers) recover the model itself.

Paper: Milli, Schmidt, Dragan and Hardt, "Model Reconstruction from Model Explanations" (FAT* 2019):
Sec. 3 and Algorithm 1 (exact recovery of a two-layer ReLU network), App. C (membership queries only),
footnote 2 (logistic models), Sec. 4 (gradient matching for deep models).

Entry points: :func:`~stealkit.extract.explanations.exact.recover_two_layer`,
:func:`~stealkit.extract.explanations.exact_mq.recover_two_layer_mq`,
:func:`~stealkit.extract.explanations.logistic_exact.identify_logistic` and
:func:`~stealkit.extract.explanations.gradient_matching.extract_gradient_matching`.
"""
