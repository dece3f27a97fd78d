"""Reports across runs: the comparison table and plots of an ablation sweep (compare.py)."""
