"""Evaluation: answer metrics (EM/F1), LLM-judge accuracy, search-behaviour statistics, reports."""
