"""Extraction attacks: one module per method, sharing the victim handle, losses and result type."""

from stealkit.extract.baseline import BaselineConfig, extract_baseline
from stealkit.extract.common import ExtractionResult, Victim, open_victim

__all__ = ["BaselineConfig", "ExtractionResult", "Victim", "extract_baseline", "open_victim"]
