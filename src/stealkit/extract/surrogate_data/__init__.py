"""Surrogate-data extraction: the attacker holds natural images, asks the victim about them and trains a copy.

Papers: Truong et al., "Data-Free Model Extraction" (CVPR 2021), appendix A (the surrogate-data attack);
Papernot et al. 2017 and Orekondy et al., "Knockoff Nets" (CVPR 2019) Sec. 4.1.2 (the adaptive policy);
Pal et al., "ActiveThief" (AAAI 2020) for margin selection; Sohn et al., "FixMatch" (NeurIPS 2020) on the
unqueried pool, as in Jagielski et al. 2020 Sec. 5.2.

Entry points: :func:`~stealkit.extract.surrogate_data.surrogate.extract_surrogate` with
:class:`~stealkit.extract.surrogate_data.surrogate.SurrogateConfig` (its validated default is
:func:`~stealkit.extract.surrogate_data.presets.resolve_preset` ``"auto"``), and
:func:`~stealkit.extract.surrogate_data.baseline.extract_baseline` (plain pool labelling).
"""
