"""Supervised fine-tuning: masked-loss examples (``examples``), the SFT trainer (``trainer``), and SFT rows
from agent trajectories for the warm starts (``trajectories``)."""
