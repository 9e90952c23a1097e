"""Turning reproduction run files into evidence: budgets, per-method tables, paired statistics,
verdicts on the paper's claims and the paper's figures, all computed from `runs/*.json` alone."""
