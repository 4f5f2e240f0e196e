"""Evaluation: pass@k of a model, checkpoint or served model on benchmarks, single- or multi-agent.

``runner.run_evaluation`` is what ``pettingllms eval`` runs; ``passk.pass_at_k`` is the estimator (standard
library only, so importing this package stays light). See docs/evaluation.md.
"""

from pettingllms.eval.passk import mean_pass_at_k, pass_at_k

__all__ = ["mean_pass_at_k", "pass_at_k"]
