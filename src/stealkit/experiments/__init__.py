"""Experiments: standard victims, configs, the runner, sweeps and the studies that reproduce each paper."""
