"""pass@k evaluation: samples files, results, the markdown table and the pass@k plot.

The command line is ``python -m pacs_fast.eval`` (see :mod:`pacs_fast.eval`).
"""
from pacs_fast.evaluation.report import markdown_table, plot_pass_at_k
from pacs_fast.evaluation.results import (default_ks, default_n, load_results, read_samples,
                                          results_from_samples, summarize_benchmark)

__all__ = ["default_ks", "default_n", "load_results", "markdown_table", "plot_pass_at_k", "read_samples",
           "results_from_samples", "summarize_benchmark"]
