"""Bridges to other tools (IBM's ART); each module imports its tool lazily, behind an optional extra."""
