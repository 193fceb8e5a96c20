"""Data-free extraction: a generator synthesises the queries; no natural data is needed.

Papers: Truong et al., "Data-Free Model Extraction" (DFME, CVPR 2021) and its appendix; Kariyappa et al.,
"MAZE" (CVPR 2021); Zhou et al., "DaST" (CVPR 2020); CoDFe ("Towards Data-Free Model Stealing in a Hard Label
Setting", the confident data-free stealing seed paper); Rosenthal et al., "DisGUIDE" (AAAI 2023) for the
disagreement objective; CaBaGE (ECCV 2024) for class-balanced filtering and hard replay.

Entry points: :func:`~stealkit.extract.datafree.dfme.extract_dfme`, :func:`~stealkit.extract.datafree.maze.extract_maze`,
:func:`~stealkit.extract.datafree.dast.extract_dast`, :func:`~stealkit.extract.datafree.codfe.extract_codfe`;
the default recipe and ``paper`` are in :mod:`~stealkit.extract.datafree.recipes`. All share the resumable loop of
:mod:`~stealkit.extract.datafree.loop` and the label-free student selection of
:mod:`~stealkit.extract.datafree.selection`.
"""
